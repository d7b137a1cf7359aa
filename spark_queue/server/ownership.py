"""Where a broker places the rows of a partitioned queue that may go to any partition (a
publish without keys or a producer, sent whole to it): the partitions it owns among the
live brokers of its table (:func:`~spark_queue.model.assignment.keyless_partitions`), so
that two brokers' keyless rounds never race for one partition table's commits.

The broker sees the live brokers as a client on its machine with its token sees them
(:func:`~spark_queue.broker.discovery.distrust`), itself among them, looked up at most
every :data:`~spark_queue.broker.client.DISCOVERY_SECONDS`: a broker that stops or dies
leaves the set within the time its clients take to leave it, and its partitions join the
turns of the brokers they move to.
"""

from __future__ import annotations

import logging
import threading
import time

from spark_queue.broker.client import DISCOVERY_SECONDS
from spark_queue.broker.discovery import distrust, live_brokers
from spark_queue.model.assignment import keyless_partitions
from spark_queue.storage.location import Location

log = logging.getLogger(__name__)


class OwnedPartitions:
    """The partitions broker ``broker_id`` of the table at ``location`` places keyless rows
    in (``key``: its token's, None without one), given a queue and its partition count:
    :attr:`~spark_queue.partitioned.Partitions.keyless_places` of the broker's table.
    Thread-safe."""

    def __init__(self, location: Location, broker_id: str, key: bytes | None) -> None:
        self.location = location
        self.broker_id = broker_id
        self.key = key
        self._lock = threading.Lock()
        self._peers: frozenset[str] = frozenset()  # the live brokers' ids last looked up
        self._looked_at = -float("inf")  # time.monotonic() of that look
        self._looking = False
        self._places: dict[tuple[str, int], list[int]] = {}  # for self._peers

    def __call__(self, queue: str, count: int) -> list[int]:
        self._look_up()
        with self._lock:
            places = self._places.get((queue, count))
            if places is None:
                places = keyless_partitions(queue, count, self.broker_id, self._peers)
                self._places[(queue, count)] = places
            return places

    def _look_up(self) -> None:
        """The live brokers anew where the last look is :data:`DISCOVERY_SECONDS` old, in
        this thread, outside the lock: the other calls meanwhile go by the brokers known
        (none before the first look: this one alone). A look that fails keeps them."""
        with self._lock:
            if self._looking or time.monotonic() - self._looked_at <= DISCOVERY_SECONDS:
                return
            self._looking = True
        found = None
        try:
            records = live_brokers(self.location, (), lambda r: distrust(r, self.key) is None)
            found = frozenset(r.id for r in records)
        except Exception as error:  # the store's error: the next look tries again
            log.debug("broker lookup in %s failed: %s", self.location.uri, error)
        finally:
            with self._lock:
                self._looking = False
                self._looked_at = time.monotonic()
                if found is not None and found != self._peers:
                    self._peers = found
                    self._places.clear()
