"""What the length of a Delta log costs delta-rs's commits and updates, on a local disk and
on S3 (the suite's S3 server, moto's), for the log bound ``spark_queue.logRetentionVersions``
(docs/decisions/log-retention.md, docs/MAINTENANCE.md "Log cleanup").

For each store and each log length, a table is made whose log holds that many commit
entries (the first by delta-rs, the others written straight to the log: commits of a
``commitInfo`` each, as fast to make as a PUT) and a checkpoint at its latest version, as a
log looks that cleanup left long: delta-rs replays from the checkpoint, so only the log's
*listing* grows with its length. Then, the median of ``--repeats`` each:

- ``update_ms``: ``update_incremental`` of a table at the latest version (nothing new): what
  a reader that is not sure it is current pays;
- ``commit_ms``: a commit of a table at the latest version (``create_write_transaction``, no
  retries, as ``QueueStore.commit``) and the update that reads it back: what every connector
  commit pays;
- ``open_ms``: a table opened afresh;
- ``cleanup_ms``: spark-queue's log cleanup (``maintenance.cleanup_log``, run after each
  checkpoint) where nothing has expired: its listing of the whole log;
- on S3, the ``LIST`` requests of one update, of one commit with its update, and of one
  cleanup; and ``server_list_ms``, the server's time for the listing an update sends (from
  the latest entry, ``start-after``) sent by itself: where it grows with the log, the store
  does, not delta-rs (moto scans every key of a bucket for it; S3 lists from the key).

    .venv/bin/python benchmarks/bench_log_length.py [--lengths 50 1000 4000] [--repeats 15]
        [--stores local s3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
from common import median_ms, write_results
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, write_deltalake

from spark_queue.commit.maintenance import cleanup_log
from spark_queue.storage.location import Location
from tests.object_store import RequestLog, new_bucket, server_options, start_s3_server

ROW = pa.table({"a": pa.array([1], pa.int64())})


def entry(version: int) -> bytes:
    info = {"timestamp": int(time.time() * 1000), "operation": "WRITE", "operationParameters": {}}
    return (json.dumps({"commitInfo": {**info, "readVersion": version - 1}}) + "\n").encode()


def make_log(uri: str, options: dict[str, str], length: int) -> None:
    """A table at ``uri`` whose log holds ``length`` commits and a checkpoint of the last."""
    write_deltalake(uri, ROW, storage_options=options)
    fs, base = Location.of(uri, options).filesystem()
    for version in range(1, length):
        with fs.open_output_stream(f"{base}/_delta_log/{version:020d}.json") as out:
            out.write(entry(version))
    DeltaTable(uri, storage_options=options).create_checkpoint()


def commit(table: DeltaTable) -> None:
    """A commit as ``QueueStore.commit`` makes it (no retries, delta-rs's post-commit hooks
    off: spark-queue checkpoints and cleans up itself), and its read back."""
    table.create_write_transaction(
        [],
        mode="append",
        schema=ROW.schema,
        commit_properties=CommitProperties(max_commit_retries=0),
        post_commithook_properties=PostCommitHookProperties(
            create_checkpoint=False, cleanup_expired_logs=False
        ),
    )
    table.update_incremental()


def cleanup(uri: str, options: dict[str, str]) -> None:
    """The cleanup after a checkpoint, where nothing has expired: it lists the whole log."""
    assert cleanup_log(Location.of(uri, options), retention_hours=1e6, max_versions=None) == []


def measure(
    uri: str, options: dict[str, str], length: int, repeats: int, requests: RequestLog | None
) -> dict[str, Any]:
    make_log(uri, options, length)
    table = DeltaTable(uri, storage_options=options)
    result: dict[str, Any] = {
        "log_entries": length,
        "update_ms": median_ms(table.update_incremental, repeats),
        "commit_ms": median_ms(lambda: commit(table), repeats),
        "open_ms": median_ms(
            lambda: DeltaTable(uri, storage_options=options), max(3, repeats // 3)
        ),
        "cleanup_ms": median_ms(lambda: cleanup(uri, options), max(3, repeats // 3)),
    }
    if requests is not None:
        bucket = uri.split("/")[2]
        for name, action in (
            ("update", table.update_incremental),
            ("commit", lambda: commit(table)),
            ("cleanup", lambda: cleanup(uri, options)),
        ):
            requests.mark()
            action()
            lists = [t for m, t in requests.since_mark(bucket) if m == "GET" and "list-type" in t]
            result[f"{name}_lists"] = len(lists)
        key = uri.split("/", 3)[3]
        listing = (
            f"{options['AWS_ENDPOINT_URL']}/{bucket}?list-type=2&prefix={key}/_delta_log/"
            f"&start-after={key}/_delta_log/{table.version():020d}.json"
        )
        result["server_list_ms"] = median_ms(
            lambda: urllib.request.urlopen(listing).read(), repeats
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[50, 1000, 4000])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--stores", nargs="+", choices=("local", "s3"), default=["local", "s3"])
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {store: [] for store in args.stores}
    with tempfile.TemporaryDirectory(prefix="bench-log-length-") as scratch:
        for length in args.lengths if "local" in args.stores else ():
            uri = str(Path(scratch) / f"log-{length}")
            results["local"].append(measure(uri, {}, length, args.repeats, None))
            print("local", results["local"][-1], flush=True)
        if "s3" in args.stores:
            server, endpoint = start_s3_server(str(Path(scratch) / "s3.log"))
            try:
                options = server_options(endpoint)
                requests = RequestLog(str(Path(scratch) / "s3.log"))
                for length in args.lengths:
                    uri = f"s3://{new_bucket(options, f'log-{length}')}/table"
                    results["s3"].append(measure(uri, options, length, args.repeats, requests))
                    print("s3", results["s3"][-1], flush=True)
            finally:
                server.kill()
                server.wait()
    write_results("log_length.json", results)


if __name__ == "__main__":
    main()
