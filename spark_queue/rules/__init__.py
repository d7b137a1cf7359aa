"""The queue rules, pure: queue semantics as plain functions over numpy and Arrow.

Nothing here touches Spark, Delta or files. A queue is a :class:`QueueState` (arguments, counters,
per-priority *levels*, the index of scheduled messages); the messages already stored are
reached through a :class:`HeadReader`, which yields one level's rows in ``seq`` order from a
position, so the caller decides how they are fetched (Delta file statistics in the store, a
list in the tests). Only the head of a queue is read, and only as far as evictions need: the
cost of an enqueue does not grow with the queue's depth.

Head order is ``priority`` descending, then ``seq`` ascending. Every level keeps ``head``, a
position at or below its first ready message. A queue's live messages are:

- its rows at or after their level's ``head`` that are not in ``holes`` (removed out of order);
- ``extras``: messages below their level's head that became ready again (a scheduled message
  that fell due joins at its seq position, SEMANTICS §2);
- ``scheduled``: the index of messages whose ``deliver_at`` is in the future. A head may pass
  them: they are found through the index, and counted once they are due;
- ``leases``: messages delivered to a consumer and not yet acknowledged (SEMANTICS §3). A
  lease is taken from the head, so the head passes it; a returned message becomes an extra.

Modules, one concept each:

- :mod:`~spark_queue.rules.columns`: leases, the scheduled index and redelivery counts as
  numpy columns;
- :mod:`~spark_queue.rules.state`: :class:`QueueState`, its JSON form, gauges and the
  counter identity;
- :mod:`~spark_queue.rules.change`: :class:`QueueChange`, one commit's change to one queue,
  read from the head through a :class:`HeadReader`, ending in a :class:`QueuePlan`;
- :mod:`~spark_queue.rules.overflow`: where limits are decided (``plan_enqueue``,
  ``plan_settle``);
- :mod:`~spark_queue.rules.ids`: de-duplication by message id (``id_hashes``, the window
  ``SeenIds``);
- :mod:`~spark_queue.rules.leases`: where leases are decided (``plan_lease``, ``plan_ack``,
  ``plan_return``, ``plan_expire``, ``plan_extend``).
"""

from spark_queue.rules.change import HEAD_SCHEMA, HeadReader, QueuePlan, Removal
from spark_queue.rules.columns import (
    INDEX_INTS,
    NEVER,
    NO_TIME,
    Lease,
    Leases,
    MessageIndex,
    Redelivered,
    Scheduled,
    ascending,
    distinct,
    is_ascending,
    member,
)
from spark_queue.rules.ids import SeenIds, SeenRun, id_hashes
from spark_queue.rules.leases import plan_ack, plan_expire, plan_extend, plan_lease, plan_return
from spark_queue.rules.overflow import plan_enqueue, plan_settle
from spark_queue.rules.state import (
    COUNTERS,
    TERMINAL,
    Level,
    QueueState,
    below_heads,
    counters_and_gauges,
    gauges,
    identity_holds,
    leased_by_consumer,
    live_mask,
    settles,
)

__all__ = [
    "COUNTERS",
    "HEAD_SCHEMA",
    "INDEX_INTS",
    "NEVER",
    "NO_TIME",
    "TERMINAL",
    "HeadReader",
    "Lease",
    "Leases",
    "Level",
    "MessageIndex",
    "QueuePlan",
    "QueueState",
    "Redelivered",
    "Removal",
    "Scheduled",
    "SeenIds",
    "SeenRun",
    "ascending",
    "below_heads",
    "counters_and_gauges",
    "distinct",
    "gauges",
    "id_hashes",
    "identity_holds",
    "is_ascending",
    "leased_by_consumer",
    "live_mask",
    "member",
    "plan_ack",
    "plan_enqueue",
    "plan_expire",
    "plan_extend",
    "plan_lease",
    "plan_return",
    "plan_settle",
    "settles",
]
