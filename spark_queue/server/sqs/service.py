"""The broker's SQS API (``spark-queue broker PATH --sqs HOST:PORT``, docs/SQS.md): Amazon
SQS's AWS JSON 1.0 protocol served by aiohttp, on the broker's ``QueueTable`` and its group
commit, beside the Flight service.

What a request means for the table is the plain functions' of the package's other
modules (names, attributes, messages, handles, shapes), signatures are
:mod:`~spark_queue.server.sqs.signing`'s and the connections' bounds
:mod:`~spark_queue.server.sqs.http`'s; this module checks a request in that order (headers
and credential, then the body, then the signature), runs the table's blocking calls on a
thread pool, and long-polls an empty queue without committing (a lease that finds nothing
commits nothing; between leases it waits for a send through this broker, or for a new
table version, checked every :data:`POLL_SECONDS`).

The settings SQS has and queue arguments lack (``VisibilityTimeout``, ``DelaySeconds``,
``MaximumMessageSize``, ``ReceiveMessageWaitTimeSeconds``, ``ContentBasedDeduplication``,
tags, a deletion through SQS) are kept in ``_spark_queue/sqs/<queue>.json`` under the table
root (:class:`SqsSettings`).

Every request is reported to :attr:`SqsService.observe` (action, seconds, error code or
None): the one place per-action counts, errors and latency are recorded.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import functools
import hashlib
import json
import logging
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from aiohttp import web

from spark_queue.errors import (
    ArgumentMismatchError,
    InvalidInputError,
    InvalidOptionError,
    QueueError,
    QueueNotFoundError,
)
from spark_queue.model.schema import LEASE_VERSION_KEY, LEASE_VERSIONS_KEY
from spark_queue.server.sqs import handles, http, shapes, signing
from spark_queue.server.sqs.attributes import (
    SqsOnly,
    needs_stats,
    parse_attributes,
    queue_attributes,
)
from spark_queue.server.sqs.errors import SqsError, failed_entry, invalid
from spark_queue.server.sqs.limits import (
    DEFAULT_RETENTION_SECONDS,
    FIFO_DEDUP_MS,
    MAX_BATCH,
    MAX_LIST_RESULTS,
    MAX_MESSAGE_BYTES,
    MAX_RECEIVE_WAIT_SECONDS,
    MAX_VISIBILITY_SECONDS,
    HttpLimits,
)
from spark_queue.server.sqs.messages import Outgoing, incoming, message_id, outgoing
from spark_queue.server.sqs.names import (
    CONSUMER,
    check_new_queue_name,
    check_queue_name,
    is_fifo,
    name_of_url,
    queue_url,
)
from spark_queue.server.sqs.redrive import RedriveWatch
from spark_queue.storage.location import Location
from spark_queue.storage.store import now_micros
from spark_queue.table import QueueTable

log = logging.getLogger("spark_queue.server.sqs")

SETTINGS_FOLDER = "_spark_queue/sqs"
SETTINGS_TTL_SECONDS = 5.0  # another broker's change to a queue's settings shows this late
POLL_SECONDS = 0.05  # an idle long poll checks for a new table version this often (local)
OBJECT_STORE_POLL_SECONDS = 0.2  # and on an object store, where each check is a request
SETTLE_SECONDS = 1.0  # and leases again at least this often (leases run out, delays end)
THREADS = 32
MAX_SETTINGS_STEM = 250  # a settings file's name before ".json", at most

Observer = Callable[[str, float, "str | None"], None]
T = TypeVar("T")


def _unobserved(action: str, seconds: float, error: str | None) -> None:
    """The default :attr:`SqsService.observe`: records nothing."""


class SqsSettings:
    """Each queue's :class:`~spark_queue.server.sqs.attributes.SqsOnly`, one JSON file per queue,
    cached for :data:`SETTINGS_TTL_SECONDS`. A queue without a file has SQS's defaults."""

    def __init__(self, location: Location) -> None:
        self.fs, base = location.filesystem()
        self.folder = f"{base.rstrip('/')}/{SETTINGS_FOLDER}"
        self.local = not location.scheme
        self._cache: dict[str, tuple[float, SqsOnly | None]] = {}
        self._lock = threading.Lock()

    def _path(self, name: str) -> str:
        # A file name has 255 bytes on local disks: a longer queue name (the table allows
        # 255 characters) is cut and completed by its digest after a '+', which no queue
        # name holds, so no two queues share a file.
        if len(name) > MAX_SETTINGS_STEM:
            digest = hashlib.sha256(name.encode()).hexdigest()[:16]
            name = f"{name[: MAX_SETTINGS_STEM - 17]}+{digest}"
        return f"{self.folder}/{name}.json"

    def cached(self, name: str) -> tuple[bool, SqsOnly | None]:
        """Whether the queue's settings are cached and fresh, and if so, them."""
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None and time.monotonic() - cached[0] < SETTINGS_TTL_SECONDS:
            return True, cached[1]
        return False, None

    def get(self, name: str) -> SqsOnly | None:
        """The queue's settings; None where it has no file."""
        fresh, settings = self.cached(name)
        if fresh:
            return settings
        try:
            with self.fs.open_input_stream(self._path(name)) as stream:
                found: SqsOnly | None = SqsOnly.from_json(stream.read().decode())
        except FileNotFoundError:
            found = None
        except (OSError, ValueError, TypeError) as error:
            if "not found" not in str(error).lower() and "no such" not in str(error).lower():
                raise
            found = None
        with self._lock:
            self._cache[name] = (time.monotonic(), found)
        return found

    def put(self, name: str, settings: SqsOnly) -> None:
        body = settings.to_json().encode()
        path = self._path(name)
        if self.local:  # through a rename: a reader never sees half a file
            self.fs.create_dir(self.folder, recursive=True)
            staged = f"{self.folder}/.{uuid.uuid4().hex}.writing"
            with self.fs.open_output_stream(staged) as out:
                out.write(body)
            self.fs.move(staged, path)
        else:  # an object store's PUT is atomic by itself
            with self.fs.open_output_stream(path) as out:
                out.write(body)
        with self._lock:
            self._cache[name] = (time.monotonic(), settings)


def _now_seconds() -> int:
    return int(time.time())


class SqsService:
    """The SQS actions on ``table`` (a ``QueueTable`` with ``broker="off"``).

    Args:
        table: the broker's table.
        keys: access key id -> secret: requests must be signed with one (SigV4); None:
            requests are taken unsigned or signed with any key (loopback only).
        limits: what a connection is allowed.
    """

    def __init__(
        self,
        table: QueueTable,
        keys: Mapping[str, str] | None,
        limits: HttpLimits | None = None,
    ) -> None:
        self.table = table
        self.keys = dict(keys) if keys is not None else None
        self.limits = limits if limits is not None else HttpLimits()
        self.settings = SqsSettings(table.store.location)
        shapes.input_shapes()  # read before the first request waits for it (~0.3 s)
        self.handles = handles.HandleKeys(table.store.location)
        self.redrive = RedriveWatch(table)
        self.observe: Observer = _unobserved
        self.poll_seconds = POLL_SECONDS if self.settings.local else OBJECT_STORE_POLL_SECONDS
        self._pool = concurrent.futures.ThreadPoolExecutor(THREADS, "sqs")
        self._known: set[str] = set()  # queues seen in the table (never removed from it)
        self._known_lock = threading.Lock()
        self._events: dict[str, asyncio.Event] = {}
        # (table, version): (checked at, found)
        self._log_checks: dict[tuple[str, int], tuple[float, bool]] = {}
        self.stopping = False  # once set, long polls answer at once with what they have
        self.actions: dict[str, Callable[[dict[str, Any], str], Any]] = {
            "CreateQueue": self.create_queue,
            "GetQueueUrl": self.get_queue_url,
            "ListQueues": self.list_queues,
            "GetQueueAttributes": self.get_queue_attributes,
            "SetQueueAttributes": self.set_queue_attributes,
            "DeleteQueue": self.delete_queue,
            "PurgeQueue": self.purge_queue,
            "SendMessage": self.send_message,
            "SendMessageBatch": self.send_message_batch,
            "ReceiveMessage": self.receive_message,
            "DeleteMessage": self.delete_message,
            "DeleteMessageBatch": self.delete_message_batch,
            "ChangeMessageVisibility": self.change_message_visibility,
            "ChangeMessageVisibilityBatch": self.change_message_visibility_batch,
            "TagQueue": self.tag_queue,
            "UntagQueue": self.untag_queue,
            "ListQueueTags": self.list_queue_tags,
            "ListDeadLetterSourceQueues": self.list_dead_letter_source_queues,
        }

    # -- HTTP ----------------------------------------------------------------------------------

    def server(self) -> http.GuardedServer:
        """The aiohttp server of this service (made on the event loop that runs it)."""
        return http.GuardedServer(self.handle, self.limits)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """One request: its headers and credential checked, then its body read, then its
        signature checked, then the action it signed run."""
        started = time.perf_counter()
        shown = "unknown"
        try:
            headers = signing.headers_of(request.headers.items())
            signing.refuse_repeated(headers)
            target = signing.first(headers, "x-amz-target") or ""
            prefixed = target.startswith(http.TARGET_PREFIX)
            action = target[len(http.TARGET_PREFIX) :] if prefixed else ""
            shown = action if action in self.actions else "unknown"
            signer = None
            if self.keys is not None:
                signer = signing.credential(headers, self.keys, time.time())
            if request.method != "POST":
                raise SqsError(
                    "UnknownOperationException",
                    "The endpoint takes POST requests (AWS JSON 1.0, X-Amz-Target: "
                    "AmazonSQS.<Action>).",
                )
            body = await http.read_body(request, self.limits, action.endswith("Batch"))
            if signer is not None:
                signing.verify(signer, request.method, request.raw_path, headers, body)
            if action not in self.actions:
                raise SqsError(
                    "UnknownOperationException",
                    f"The action {target[:100]!r} is not valid for this endpoint; it serves "
                    f"{', '.join(self.actions)} (X-Amz-Target: AmazonSQS.<Action>).",
                )
            members = shapes.parse_request(action, body)
            answer = await self.actions[action](members, f"{request.scheme}://{request.host}")
        except SqsError as error:
            self.observe(shown, time.perf_counter() - started, error.code)
            response = http.error_response(error)
            if not request.content.is_eof():  # a body left unread: the connection ends
                response.force_close()
            return response
        self.observe(shown, time.perf_counter() - started, None)
        return http.answer(answer)

    # -- the table, off the event loop -----------------------------------------------------

    async def _run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A blocking call on the pool, its table errors as SQS's."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, functools.partial(call, *args, **kwargs))
        except SqsError:
            raise
        except QueueNotFoundError as error:
            raise SqsError("QueueDoesNotExist", str(error).strip("'\"")) from None
        except (InvalidOptionError, InvalidInputError) as error:
            raise SqsError("InvalidParameterValue", str(error)) from None
        except ArgumentMismatchError as error:
            raise SqsError("QueueNameExists", str(error)) from None
        except QueueError as error:
            log.warning("an SQS request failed: %s: %s", type(error).__name__, error)
            raise SqsError("ServiceUnavailable", f"{type(error).__name__}: {error}") from None
        except Exception as error:
            log.error("an SQS request failed: %s: %s", type(error).__name__, error)
            log.debug("the failure's traceback", exc_info=True)
            raise SqsError("InternalError", f"the broker failed: {type(error).__name__}") from None

    def _exists(self, name: str) -> bool:
        with self._known_lock:
            if name in self._known:
                return True
        queues = self.table.queues()
        with self._known_lock:
            self._known.update(queues)
            return name in self._known

    def _settings(self, name: str) -> SqsOnly:
        """A live queue's settings (SQS's defaults where it has none).

        Raises:
            SqsError: ``QueueDoesNotExist``: not in the table, or deleted through SQS.
        """
        settings = self.settings.get(name)
        if not self._exists(name) or (settings is not None and settings.deleted):
            raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
        return settings if settings is not None else SqsOnly()

    async def _queue(self, request: Mapping[str, Any]) -> tuple[str, SqsOnly]:
        name = name_of_url(request["QueueUrl"])
        fresh, settings = self.settings.cached(name)
        with self._known_lock:
            known = name in self._known
        if fresh and known:  # the common case: no trip to the pool
            if settings is not None and settings.deleted:
                raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
            return name, settings if settings is not None else SqsOnly()
        return name, await self._run(self._settings, name)

    def _wake(self, name: str) -> None:
        event = self._events.pop(name, None)
        if event is not None:
            event.set()

    def end_polls(self) -> None:
        """Answer every long poll now (the broker is stopping); call on the event loop."""
        self.stopping = True
        self.redrive.stop()
        for name in list(self._events):
            self._wake(name)

    # -- queues --------------------------------------------------------------------------------

    async def create_queue(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        name: str = request["QueueName"]
        attributes: dict[str, str] = request.get("Attributes") or {}
        check_new_queue_name(name, attributes.get("FifoQueue"))
        tags = _tags(request.get("tags"), "tags")
        return await self._run(self._create, name, attributes, tags, base)

    def _create(
        self, name: str, attributes: Mapping[str, str], tags: dict[str, str], base: str
    ) -> dict[str, Any]:
        # Everything is checked before anything is written: a refused request writes nothing.
        queues = frozenset(self.table.queues())
        change = parse_attributes(name, attributes, creating=True, queues=queues)
        settings = self.settings.get(name)
        now = _now_seconds()
        if name in queues and not (settings is not None and settings.deleted):
            current = settings or SqsOnly()
            stored = self.table.arguments(name)
            differing = [
                *(f for f, v in change.sqs.items() if getattr(current, f) != v),
                *(a for a, v in change.arguments.items() if getattr(stored, a) != v),
            ]
            if differing:
                raise SqsError(
                    "QueueNameExists",
                    f"A queue already exists with the same name and a different value for "
                    f"attribute {change.origin[differing[0]]}",
                )
            try:
                self.table.declare(name, **change.arguments)
            except ArgumentMismatchError as error:
                raise SqsError(
                    "QueueNameExists",
                    f"A queue already exists with the same name and different attributes: {error}",
                ) from None
        else:
            arguments = dict(change.arguments)
            if name not in queues:  # SQS's defaults, for a queue SQS creates
                arguments.setdefault("expiration", DEFAULT_RETENTION_SECONDS * 1000)
                if is_fifo(name):
                    arguments.setdefault("message_groups", True)
                    arguments.setdefault("duplicate_window", FIFO_DEDUP_MS)
                self.table.declare(name, **arguments)
            elif arguments:  # created again after a DeleteQueue
                self.table.alter(name, **arguments)
            self.settings.put(
                name,
                replace(
                    SqsOnly(), **change.sqs, tags=tuple(sorted(tags.items())), created=now,
                    modified=now,
                ),
            )  # fmt: skip
        with self._known_lock:
            self._known.add(name)
        return {"QueueUrl": queue_url(base, name)}

    async def get_queue_url(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        name = check_queue_name(request["QueueName"])
        await self._run(self._settings, name)
        return {"QueueUrl": queue_url(base, name)}

    async def list_queues(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        prefix = request.get("QueueNamePrefix") or ""
        limit = shapes.bounded(request, "MaxResults", 1, MAX_LIST_RESULTS)
        token = request.get("NextToken")
        after = ""
        if token is not None:
            try:
                after = base64.urlsafe_b64decode(token.encode()).decode()
            except (ValueError, UnicodeDecodeError):
                raise invalid("NextToken", token, "not a token ListQueues gave") from None

        def live() -> list[str]:
            names = [n for n in self.table.queues() if n.startswith(prefix) and n > after]
            return [n for n in names if not (self.settings.get(n) or SqsOnly()).deleted]

        names = await self._run(live)
        answer: dict[str, Any] = {}
        if limit is not None and len(names) > limit:
            names = names[:limit]
            answer["NextToken"] = base64.urlsafe_b64encode(names[-1].encode()).decode()
        answer["QueueUrls"] = [queue_url(base, n) for n in names]
        return answer

    async def get_queue_attributes(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        name, settings = await self._queue(request)
        wanted = request.get("AttributeNames") or []
        if not wanted:
            return {}
        arguments = await self._run(self.table.arguments, name)
        stats = await self._run(self.table.stats, name) if needs_stats(wanted) else None
        return {"Attributes": queue_attributes(name, arguments, settings, stats, wanted)}

    async def set_queue_attributes(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        name, settings = await self._queue(request)
        attributes = request["Attributes"]

        def change() -> None:
            parsed = parse_attributes(
                name, attributes, creating=False, queues=frozenset(self.table.queues())
            )
            if parsed.arguments:
                self.table.alter(name, **parsed.arguments)
            if parsed.sqs:
                self.settings.put(name, replace(settings, **parsed.sqs, modified=_now_seconds()))

        await self._run(change)
        return {}

    async def delete_queue(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        name, settings = await self._queue(request)

        def delete() -> None:
            # The table keeps every queue it has had: a deleted queue is emptied and hidden.
            self.table.release(name, consumer=CONSUMER)
            self.table.purge(name)
            self.settings.put(name, replace(settings, deleted=True, modified=_now_seconds()))

        await self._run(delete)
        return {}

    async def purge_queue(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        name, _ = await self._queue(request)

        def purge() -> None:
            self.table.release(name, consumer=CONSUMER)  # SQS purges messages in flight too
            self.table.purge(name)

        await self._run(purge)
        return {}

    async def tag_queue(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        name, settings = await self._queue(request)
        tags = {**dict(settings.tags), **_tags(request.get("Tags"), "Tags")}
        if len(tags) > 50:
            raise invalid("Tags", len(tags), "a queue has at most 50 tags")
        updated = replace(settings, tags=tuple(sorted(tags.items())))
        await self._run(self.settings.put, name, updated)
        return {}

    async def untag_queue(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        name, settings = await self._queue(request)
        keys = set(request["TagKeys"])
        tags = tuple((k, v) for k, v in settings.tags if k not in keys)
        await self._run(self.settings.put, name, replace(settings, tags=tags))
        return {}

    async def list_queue_tags(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        _, settings = await self._queue(request)
        return {"Tags": dict(settings.tags)} if settings.tags else {}

    async def list_dead_letter_source_queues(
        self, request: dict[str, Any], base: str
    ) -> dict[str, Any]:
        name, _ = await self._queue(request)

        def sources() -> list[str]:
            snapshot = self.table.store.snapshot()
            states = snapshot.states if snapshot is not None else {}
            return sorted(n for n, s in states.items() if s.arguments.dead_letter_queue == name)

        return {"queueUrls": [queue_url(base, n) for n in await self._run(sources)]}

    # -- sending -------------------------------------------------------------------------------

    async def send_message(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        name, settings = await self._queue(request)
        message = outgoing(request, name, settings, now_micros())
        [(answer, error)] = await self._publish(name, [message])
        if error is not None:
            raise error
        return answer

    async def send_message_batch(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        name, settings = await self._queue(request)
        entries = shapes.batch_entries(request)
        now = now_micros()
        failed: list[dict[str, Any]] = []
        ready: list[tuple[str, Outgoing]] = []
        for entry in entries:
            try:
                ready.append((entry["Id"], outgoing(entry, name, settings, now)))
            except SqsError as error:
                failed.append(failed_entry(entry["Id"], error))
        total = sum(m.size for _, m in ready)
        if total > MAX_MESSAGE_BYTES:
            raise SqsError(
                "BatchRequestTooLong",
                f"Batch requests cannot be longer than {MAX_MESSAGE_BYTES} bytes. You "
                f"have sent {total} bytes.",
            )
        successful = []
        if ready:
            answers = await self._publish(name, [m for _, m in ready])
            for (entry_id, _), (answer, refusal) in zip(ready, answers, strict=True):
                if refusal is not None:
                    failed.append(failed_entry(entry_id, refusal))
                else:
                    successful.append({"Id": entry_id, **answer})
        return {"Successful": successful, "Failed": failed}

    async def _publish(
        self, name: str, messages: list[Outgoing]
    ) -> list[tuple[dict[str, Any], SqsError | None]]:
        """Publish ``messages`` in one call; each one's answer, or its error (a duplicate
        id is an answer, as in SQS; a message a reject policy refused is an error)."""
        rows = [{column: m.row.get(column) for column in _COLUMNS} for m in messages]
        outcome = await self._run(self.table.publish_outcome, name, rows)
        self._wake(name)
        seqs = iter(outcome.result.seqs)
        duplicates_left = outcome.result.duplicates
        answers: list[tuple[dict[str, Any], SqsError | None]] = []
        for message, stored in zip(messages, outcome.accepted.tolist(), strict=True):
            answer: dict[str, Any] = {"MD5OfMessageBody": message.md5_body}
            if message.md5_attributes is not None:
                answer["MD5OfMessageAttributes"] = message.md5_attributes
            if message.md5_system_attributes is not None:
                answer["MD5OfMessageSystemAttributes"] = message.md5_system_attributes
            if stored:
                seq = next(seqs)
                answer["MessageId"] = message_id(name, seq)
                if is_fifo(name):
                    answer["SequenceNumber"] = str(seq)
                answers.append((answer, None))
            elif message.dedup_id is not None and duplicates_left:
                duplicates_left -= 1
                answer["MessageId"] = str(
                    uuid.uuid5(uuid.NAMESPACE_URL, f"spark-queue:{name}:id:{message.dedup_id}")
                )
                answers.append((answer, None))
            else:
                answers.append(
                    (
                        answer,
                        SqsError(
                            "OverLimit",
                            f"The queue {name} refused the message: it is full (its overflow "
                            f"policy rejects what does not fit).",
                        ),
                    )
                )
        return answers

    # -- receiving -----------------------------------------------------------------------------

    async def receive_message(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        name, settings = await self._queue(request)
        count = shapes.bounded(request, "MaxNumberOfMessages", 1, MAX_BATCH) or 1
        visibility = shapes.bounded(request, "VisibilityTimeout", 0, MAX_VISIBILITY_SECONDS)
        visibility = settings.visibility_timeout if visibility is None else visibility
        wait = shapes.bounded(request, "WaitTimeSeconds", 0, MAX_RECEIVE_WAIT_SECONDS)
        wait = settings.receive_wait_seconds if wait is None else wait
        system = [
            *(request.get("AttributeNames") or []),
            *(request.get("MessageSystemAttributeNames") or []),
        ]
        attributes = request.get("MessageAttributeNames") or []
        # The secret before any lease, so that each leased message gets its handle (read or
        # written once; on the pool only then).
        loaded = bool(self.handles.known())
        key = self.handles.signing() if loaded else await self._run(self.handles.signing)
        deadline = time.monotonic() + wait
        while True:
            rows = await self._run(
                self.table.lease,
                name,
                CONSUMER,
                max_messages=count,
                lease_period=max(1, visibility * 1000),
                strict_groups=True,
            )
            if rows.num_rows or time.monotonic() >= deadline or self.stopping:
                break
            await self._idle(name, self._watched(name, rows.schema.metadata or {}), deadline)
        if not rows.num_rows:
            return {}  # as SQS answers: no Messages member at all
        received_at = int(time.time() * 1000)
        deliveries = max(rows["delivery_count"].to_pylist())
        self.redrive.received(name, deliveries, received_at / 1000 + max(visibility, 0.001))
        messages = []
        for row in rows.to_pylist():
            receipt = handles.Receipt(name, row["seq"], row["delivery_count"], received_at)
            handle = handles.issue(key, receipt)
            messages.append(incoming(row, name, system, attributes, received_at, handle))
        return {"Messages": messages}

    def _watched(self, name: str, metadata: Mapping[bytes, bytes]) -> list[tuple[Any, int]]:
        """The log entries whose arrival ends an idle wait on ``name`` after a lease that
        found nothing (its metadata): each table's next version (every partition's, of a
        partitioned queue)."""
        versions = metadata.get(LEASE_VERSIONS_KEY)
        if versions is not None:
            return [
                (self.table.partitioned.store_of(name, partition), version + 1)
                for partition, version in enumerate(json.loads(versions))
                if version is not None
            ]
        version = metadata.get(LEASE_VERSION_KEY)
        return [(self.table.store, int(version) + 1)] if version else []

    async def _idle(self, name: str, watched: list[tuple[Any, int]], deadline: float) -> None:
        """Wait until a send to ``name`` through this broker, a ``watched`` log entry, a
        settle interval or ``deadline``, whichever comes first; commits nothing."""
        event = self._events.setdefault(name, asyncio.Event())
        until = min(deadline, time.monotonic() + SETTLE_SECONDS)
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(event.wait(), timeout=min(left, self.poll_seconds))
                return
            except asyncio.TimeoutError:
                pass
            for store, version in watched:
                if await self._logged(store, version):
                    return

    async def _logged(self, store: Any, version: int) -> bool:
        """Whether ``version`` is in the table's log: one check a poll interval for all the
        polls that wait on it (many idle receivers make one request, not one each)."""
        now = time.monotonic()
        checked = self._log_checks.get((store.uri, version))
        if checked is not None and (checked[1] or now - checked[0] < self.poll_seconds):
            return checked[1]
        found = bool(await self._run(store.has_log_entry, version))
        if len(self._log_checks) > 64:
            self._log_checks.clear()
        self._log_checks[(store.uri, version)] = (now, found)
        return found

    # -- settling ------------------------------------------------------------------------------

    async def _receipt(self, handle: str, name: str) -> handles.Receipt:
        """What a receipt handle of queue ``name`` stands for, once authenticated.

        Raises:
            SqsError: ``ReceiptHandleIsInvalid`` (altered, made up, another queue's),
                ``InvalidParameterValue`` (expired), ``MissingParameter`` (empty).
        """
        payload, mac = handles.split(handle)
        if not handles.signed_by(payload, mac, self.handles.known()):
            # Perhaps another broker's secret this one has not read yet.
            keys = await self._run(self.handles.refreshed)
            if not handles.signed_by(payload, mac, keys):
                raise handles.refusal(handle)
        return handles.receipt_of(payload, handle, name, int(time.time() * 1000))

    async def delete_message(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        name, _ = await self._queue(request)
        receipt = await self._receipt(request["ReceiptHandle"], name)
        await self._run(
            self.table.ack, name, [receipt.seq], CONSUMER, deliveries=[receipt.deliveries]
        )
        return {}

    async def delete_message_batch(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        """Each entry's delivery is acknowledged, all in one call: where entries hold
        handles of several receives of one message, the latest one's deletes it and the
        earlier ones' change nothing, and each entry answers success (as SQS answers an
        earlier receive's handle)."""
        name, _ = await self._queue(request)
        failed = []
        held: set[tuple[int, int]] = set()  # (seq, delivery count)
        ids = []
        for entry in shapes.batch_entries(request):
            try:
                receipt = await self._receipt(entry["ReceiptHandle"], name)
            except SqsError as error:
                failed.append(failed_entry(entry["Id"], error))
                continue
            held.add((receipt.seq, receipt.deliveries))
            ids.append(entry["Id"])
        if held:
            seqs, deliveries = zip(*sorted(held), strict=True)
            await self._run(self.table.ack, name, list(seqs), CONSUMER, deliveries=list(deliveries))
        return {"Successful": [{"Id": i} for i in ids], "Failed": failed}

    async def change_message_visibility(self, request: dict[str, Any], base: str) -> dict[str, Any]:
        name, _ = await self._queue(request)
        await self._change_visibility(name, request)
        return {}

    async def change_message_visibility_batch(
        self, request: dict[str, Any], base: str
    ) -> dict[str, Any]:
        name, _ = await self._queue(request)
        entries = shapes.batch_entries(request)
        results = await asyncio.gather(
            *(self._change_visibility(name, e) for e in entries), return_exceptions=True
        )
        successful, failed = [], []
        for entry, result in zip(entries, results, strict=True):
            if isinstance(result, SqsError):
                failed.append(failed_entry(entry["Id"], result))
            elif isinstance(result, BaseException):
                raise result
            else:
                successful.append({"Id": entry["Id"]})
        return {"Successful": successful, "Failed": failed}

    async def _change_visibility(self, name: str, request: Mapping[str, Any]) -> None:
        receipt = await self._receipt(request["ReceiptHandle"], name)
        seconds = shapes.bounded(request, "VisibilityTimeout", 0, MAX_VISIBILITY_SECONDS)
        if seconds is None:
            raise SqsError(
                "MissingParameter", "The request must contain the parameter VisibilityTimeout."
            )
        handles.check_visibility(receipt, seconds, int(time.time() * 1000))
        seq, deliveries = receipt.seq, receipt.deliveries
        if seconds:
            changed = await self._run(
                self.table.extend, name, [seq], CONSUMER, seconds * 1000, deliveries=[deliveries]
            )
        else:  # visible again now: a cancel without a delay
            changed = await self._run(
                self.table.cancel, name, [seq], CONSUMER, delay=0, deliveries=[deliveries]
            )
            self._wake(name)
        if not changed:
            raise invalid(
                "ReceiptHandle",
                request.get("ReceiptHandle"),
                "Message does not exist or is not available for visibility timeout change.",
            )


_COLUMNS = ("body", "key", "headers", "message_id", "deliver_at")


def _tags(given: Mapping[str, str] | None, parameter: str) -> dict[str, str]:
    if given is None:
        return {}
    if not all(0 < len(k) <= 128 and len(v) <= 256 for k, v in given.items()):
        raise invalid(parameter, given, "a map of tag keys (1 to 128 characters) to values")
    return dict(given)


class SqsServer:
    """:class:`SqsService` served on ``host:port`` (port 0: a free one, then :attr:`port`)
    by aiohttp, on an event loop of its own thread; HTTPS with ``tls_files``.

    Raises:
        OSError: it cannot listen there.
    """

    def __init__(
        self,
        service: SqsService,
        host: str,
        port: int,
        tls_files: tuple[str, str] | None = None,
    ) -> None:
        self.service = service
        self.scheme = "https" if tls_files else "http"
        context = None
        if tls_files is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(tls_files[0], tls_files[1])
        self._loop = asyncio.new_event_loop()
        http.quiet_loop_errors(self._loop)
        self._runner: web.BaseRunner | None = None
        started: concurrent.futures.Future[int] = concurrent.futures.Future()

        async def start() -> int:
            self._runner = web.ServerRunner(service.server())
            await self._runner.setup()
            site = http.GuardedSite(self._runner, host, port, context, service.limits)
            await site.start()
            return int(self._runner.addresses[0][1])

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                started.set_result(self._loop.run_until_complete(start()))
            except BaseException as error:
                started.set_exception(error)
                return
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="sqs-server", daemon=True)
        self._thread.start()
        self.port = started.result()
        self.host = host

    def stop(self, timeout: float) -> None:
        """Stop listening, let requests in flight end for up to ``timeout`` seconds (long
        polls are answered empty at once), then close."""

        async def close() -> None:
            self.service.end_polls()
            if self._runner is not None:
                await self._runner.cleanup()

        future = asyncio.run_coroutine_threadsafe(close(), self._loop)
        try:
            future.result(timeout)
        except (concurrent.futures.TimeoutError, RuntimeError):
            log.warning("the SQS server did not close within %g s", timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
