"""RabbitMQ beside spark-queue: P threads of one process each publishing one message at a
time and waiting for the broker's confirm, as a durable broker's client does.

Each thread has its own connection (pika's ``BlockingConnection`` is not thread-safe) and a
channel in confirm mode; the queue is durable and every message persistent (delivery mode
2), so a confirm means the message is on the broker's disk. 200-byte bodies, as the
spark-queue measures beside it. Nothing here is installed with spark-queue: ``pika`` (a
``pip install pika`` in any environment on ``PYTHONPATH``) and a RabbitMQ server at
``--rabbitmq`` (``amqp://guest:guest@127.0.0.1:5672/``, e.g. Debian's ``rabbitmq-server``
package, started as it comes). Where either is missing, :func:`rabbitmq_row` says so in one
line and measures nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

QUEUE = "spark-queue-bench"
BODY = b"x" * 200
DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def unavailable(url: str) -> str | None:
    """Why RabbitMQ cannot be measured at ``url`` (pika missing, no server), or None."""
    try:
        import pika
    except ImportError:
        return "pika is not installed (pip install pika)"
    try:
        connection = pika.BlockingConnection(_parameters(url))
    except Exception as error:  # any refusal: the measure is skipped, saying why
        return f"no RabbitMQ at {url}: {type(error).__name__} {error}".strip()
    connection.close()
    return None


def _parameters(url: str) -> Any:
    import pika

    parameters = pika.URLParameters(url)
    parameters.connection_attempts = 1
    parameters.socket_timeout = 2
    return parameters


def publish_confirmed(url: str, count: int, seconds: float) -> tuple[int, int]:
    """``count`` threads publishing one persistent message at a time to a durable queue for
    ``seconds``, each waiting for its confirm; returns (messages confirmed, errors). The
    queue is purged first and deleted after."""
    import pika

    setup = pika.BlockingConnection(_parameters(url))
    channel = setup.channel()
    channel.queue_declare(QUEUE, durable=True)
    channel.queue_purge(QUEUE)
    ready = threading.Barrier(count + 1)
    results: list[tuple[int, int]] = [(0, 0)] * count

    def run(n: int) -> None:
        connection = pika.BlockingConnection(_parameters(url))
        own = connection.channel()
        own.confirm_delivery()
        properties = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
        sent = errors = 0
        ready.wait()
        stop = time.time() + seconds
        while time.time() < stop:
            try:
                own.basic_publish("", QUEUE, BODY, properties, mandatory=True)
                sent += 1
            except Exception:  # counted: the goal is none
                errors += 1
        results[n] = (sent, errors)
        connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    ready.wait()
    for thread in threads:
        thread.join()
    stored = channel.queue_declare(QUEUE, durable=True, passive=True).method.message_count
    channel.queue_delete(QUEUE)
    setup.close()
    sent = sum(s for s, _ in results)
    assert stored == sent, (stored, sent)  # every confirmed message is in the queue
    return sent, sum(e for _, e in results)


def rabbitmq_row(url: str, count: int, seconds: float) -> str:
    """The Markdown row of :func:`publish_confirmed` (columns as ``publish_row``'s), or one
    line saying why it was skipped."""
    why = unavailable(url)
    if why is not None:
        return f"RabbitMQ skipped: {why}"
    sent, errors = publish_confirmed(url, count, seconds)
    return (
        f"| RabbitMQ, durable queue, persistent messages, publisher confirms, threads "
        f"(a connection each) | {count} | RabbitMQ | {sent / seconds:,.0f} | {errors} | - |"
    )
