"""The latency proxy in front of the suite's S3 server: each request held once, on kept-alive
connections too, and round trips counted in all and in a row (tests/latency_proxy.py). No
Spark."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import unquote, urlsplit

import boto3
import pyarrow as pa
import pytest
from botocore.config import Config
from deltalake import write_deltalake

from tests.latency_proxy import LatencyProxy, Request, RoundTrips, in_a_row
from tests.object_store import RequestLog, new_bucket

Counter = Callable[[], AbstractContextManager[RoundTrips]]


def s3_client(options: dict[str, str]) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=options["AWS_ENDPOINT_URL"],
        aws_access_key_id=options["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=options["AWS_SECRET_ACCESS_KEY"],
        region_name=options["AWS_REGION"],
        config=Config(max_pool_connections=4, retries={"max_attempts": 1}),
    )


def bucket_of(uri: str) -> str:
    return urlsplit(uri).netloc


def test_requests_one_after_another_count_each_in_a_row(
    proxied_s3_options: dict[str, str], proxied_s3_table: str, round_trips: Counter
) -> None:
    client, bucket = s3_client(proxied_s3_options), bucket_of(proxied_s3_table)
    with round_trips() as trips:
        client.put_object(Bucket=bucket, Key="a", Body=b"one")
        assert client.get_object(Bucket=bucket, Key="a")["Body"].read() == b"one"
    assert (trips.in_all, trips.in_a_row, trips.by_method) == (2, 2, {"GET": 1, "PUT": 1}), trips
    assert [r.status for r in trips.requests] == [200, 200]


def test_requests_sent_together_count_one_in_a_row(
    proxied_s3_options: dict[str, str], proxied_s3_table: str, round_trips: Counter
) -> None:
    client, bucket = s3_client(proxied_s3_options), bucket_of(proxied_s3_table)
    client.put_object(Bucket=bucket, Key="warm", Body=b"")  # the pool's first connection
    together = threading.Barrier(2)

    def put(key: str) -> None:
        together.wait()
        client.put_object(Bucket=bucket, Key=key, Body=b"x" * 1000)

    with round_trips() as trips:
        threads = [threading.Thread(target=put, args=(key,)) for key in ("b", "c")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert (trips.in_all, trips.in_a_row, trips.by_method) == (2, 1, {"PUT": 2}), trips


def test_each_request_on_a_kept_alive_connection_is_held(
    s3_server: str, s3_options: dict[str, str]
) -> None:
    delay_ms = 200
    bucket = new_bucket(s3_options, "kept-alive")
    with LatencyProxy(s3_server, delay_ms) as proxy:
        connection = http.client.HTTPConnection("127.0.0.1", urlsplit(proxy.endpoint).port)
        took = []
        sockets = set()
        with proxy.counting(bucket) as trips:
            for method, key, body, chunked in (
                ("PUT", "k", b"x" * 300_000, False),  # a body of several chunks
                ("HEAD", "k", None, False),  # an answer without a body
                ("PUT", "parts", iter([b"abc", b"defg"]), True),  # a chunked body
                ("GET", "missing", None, False),
            ):
                began = time.perf_counter()
                connection.request(method, f"/{bucket}/{key}", body=body, encode_chunked=chunked)
                connection.getresponse().read()
                took.append(time.perf_counter() - began)
                sockets.add(id(connection.sock))
        connection.close()
    assert len(sockets) == 1  # one connection, kept alive
    assert min(took) >= delay_ms / 1000, took
    assert max(took) < 2 * delay_ms / 1000, took  # held once, not at every chunk
    assert [(r.method, r.target) for r in trips.requests] == [
        ("PUT", f"/{bucket}/k"),
        ("HEAD", f"/{bucket}/k"),
        ("PUT", f"/{bucket}/parts"),
        ("GET", f"/{bucket}/missing"),
    ]
    assert trips.requests[0].status == 200 and trips.requests[-1].status == 404
    assert (trips.in_all, trips.in_a_row) == (4, 4)


def test_the_proxy_sees_each_request_the_server_answers(
    proxied_s3_options: dict[str, str],
    proxied_s3_table: str,
    round_trips: Counter,
    s3_requests: RequestLog,
) -> None:
    """delta-rs's own client (its connections kept alive): the proxy's record and the
    server's log name the same requests."""
    row = pa.table({"n": [1]})
    write_deltalake(proxied_s3_table, row, storage_options=proxied_s3_options)
    s3_requests.mark()
    with round_trips() as trips:
        write_deltalake(proxied_s3_table, row, mode="append", storage_options=proxied_s3_options)
    logged = s3_requests.since_mark(bucket_of(proxied_s3_table))
    # The server logs targets with their query strings decoded.
    seen = sorted((r.method, unquote(r.target)) for r in trips.requests)
    assert seen == sorted((method, unquote(target)) for method, target in logged)
    assert trips.in_all >= 3 and trips.by_method["PUT"] == 2  # a data file, a log entry


def test_a_window_waits_for_the_requests_it_started(
    s3_server: str, s3_options: dict[str, str]
) -> None:
    bucket = new_bucket(s3_options, "outlasting")
    options = {**s3_options}
    with LatencyProxy(s3_server, 300) as proxy:
        options["AWS_ENDPOINT_URL"] = proxy.endpoint
        client = s3_client(options)
        client.put_object(Bucket=bucket, Key="warm", Body=b"")
        background = threading.Thread(
            target=lambda: client.put_object(Bucket=bucket, Key="late", Body=b"x")
        )
        with proxy.counting(bucket) as trips:
            background.start()
            time.sleep(0.1)  # the request is on its way when the window closes
        background.join()
    assert trips.in_all == 1 and [r.target for r in trips.after_return] == [f"/{bucket}/late"]


def request(start: float, end: float) -> Request:
    return Request("GET", "/b/k", 200, start, end)


@pytest.mark.parametrize(
    ("spans", "expected"),
    [
        ([], 0),
        ([(0, 10)], 1),
        ([(0, 10), (10, 20)], 2),  # one starts as the other ends: one after the other
        ([(0, 10), (9, 20)], 1),  # overlapping by a little: together
        ([(0, 10), (1, 11), (2, 12), (12, 20), (13, 21), (22, 30)], 3),
        ([(0, 100), (1, 10), (11, 20), (21, 30)], 3),  # a long one beside a chain
        ([(11, 20), (0, 10), (21, 30)], 3),  # in any order
    ],
)
def test_in_a_row_is_the_longest_chain_of_requests_that_do_not_overlap(
    spans: list[tuple[float, float]], expected: int
) -> None:
    assert in_a_row([request(start, end) for start, end in spans]) == expected


def test_round_trips_are_read_once_their_window_closed() -> None:
    with pytest.raises(RuntimeError, match="once their window has closed"):
        _ = RoundTrips().in_all


def test_quiet_waits_until_no_request_is_left_running(
    s3_server: str, s3_options: dict[str, str]
) -> None:
    bucket = new_bucket(s3_options, "quiet")
    with LatencyProxy(s3_server, 100) as proxy:
        client = s3_client({**s3_options, "AWS_ENDPOINT_URL": proxy.endpoint})

        def upkeep() -> None:  # requests with short gaps, as a thread's upkeep
            for n in range(3):
                client.put_object(Bucket=bucket, Key=f"u{n}", Body=b"x")
                time.sleep(0.05)

        worker = threading.Thread(target=upkeep)
        worker.start()
        time.sleep(0.02)
        proxy.quiet(bucket, 0.2)
        assert not worker.is_alive()
        with proxy.counting(bucket) as trips:
            pass
    assert trips.in_all == 0
