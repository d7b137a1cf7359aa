"""The consumer's parts, each on its own and without Spark: the prefetch bound, the pending
acknowledgements, the lease renewals and the long poll (with the log watch and the commit
listener on real tables). Times are given, not waited for."""

from __future__ import annotations

import threading

import pytest

from spark_queue import InvalidOptionError, QueueTable
from spark_queue.clients.acknowledgements import (
    DEFAULT_ACK_INTERVAL_MS,
    PendingAcknowledgements,
    acknowledgement_interval_ms,
)
from spark_queue.clients.polling import (
    FIRST_POLL_INTERVAL_SECONDS,
    LOCAL_POLL_MS,
    CommitListener,
    LogWatch,
    LongPoll,
    longest_poll_interval_ms,
    may_feed,
    operations_may_feed,
)
from spark_queue.clients.prefetch import GROWTH, RECEIVERS_SEEN_SECONDS, PrefetchBound
from spark_queue.clients.renewal import LeaseRenewals

# A lease of 0.5 s and a handler of 0.06 s a message: 0.5 / 0.06 = 8.3 messages are handled
# while a lease is in flight (far from a whole number, so rounding never decides).
LEASE_SECONDS = 0.5
HANDLING_SECONDS = 0.06


@pytest.fixture
def table(tmp_path) -> QueueTable:
    table = QueueTable(str(tmp_path / "queues"), broker="off")
    table.declare("q")
    table.declare("other")
    return table


def in_other_thread(work) -> None:
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()


def handled(bound: PrefetchBound, delivered_at: float, seconds: float, count: int = 1) -> None:
    """This thread was delivered ``count`` messages and is back ``seconds`` later."""
    bound.delivered(count, delivered_at)
    bound.receiver_back(delivered_at + seconds)


# -- prefetch ---------------------------------------------------------------------------------


def test_prefetch_starts_at_one_and_grows_when_outrun_up_to_max_prefetch():
    bound = PrefetchBound(max_prefetch=1000)
    assert bound.sizes == (1, 0)
    assert bound.lease_size(prefetched=0, held=0) == 1
    bound.grow_if_outrun()  # no lease got all it asked for yet: no growth
    assert bound.sizes == (1, 0)
    bound.lease_returned(got=1, wanted=1)
    bound.grow_if_outrun()
    assert bound.sizes == (GROWTH, GROWTH // 2)
    bound.grow_if_outrun()  # the full lease is used up by one growth
    assert bound.sizes == (GROWTH, GROWTH // 2)
    bound.lease_returned(got=GROWTH, wanted=GROWTH)
    bound.grow_if_outrun()
    assert bound.sizes == (1000, 500)  # 32 * 32 = 1024, bounded
    bound.lease_returned(got=7, wanted=1000)  # the queue ran dry: no growth
    bound.grow_if_outrun()
    assert bound.sizes == (1000, 500)


def test_prefetch_measured_holds_what_is_handled_while_a_lease_is_in_flight():
    bound = PrefetchBound(max_prefetch=1000)
    bound.lease_took(LEASE_SECONDS, now=0.0)
    assert bound.sizes == (1, 0)  # the handler is not measured yet
    handled(bound, delivered_at=1.0, seconds=HANDLING_SECONDS)
    # need = ceil(0.5 / 0.06) = 9: target 9 + 4, leasing again at min(9 - 1, 13 // 2).
    assert bound.sizes == (13, 6)
    bound.lease_returned(got=13, wanted=13)
    bound.grow_if_outrun()  # measured: no more growth by doubling
    assert bound.sizes == (13, 6)
    # Per message: three messages handed over at once and back after three times as long.
    handled(bound, delivered_at=2.0, seconds=3 * HANDLING_SECONDS, count=3)
    assert bound.sizes == (13, 6)


def test_prefetch_of_a_handler_slower_than_a_lease_is_one_ahead():
    bound = PrefetchBound(max_prefetch=1000)
    bound.lease_took(LEASE_SECONDS, now=0.0)
    handled(bound, delivered_at=1.0, seconds=2.0)
    assert bound.sizes == (1, 0)
    assert bound.lease_size(prefetched=1, held=2) == 0
    assert bound.lease_size(prefetched=0, held=1) == 1


def test_prefetch_is_bounded_by_max_prefetch_held():
    bound = PrefetchBound(max_prefetch=10)
    bound.lease_took(LEASE_SECONDS, now=0.0)
    handled(bound, delivered_at=1.0, seconds=HANDLING_SECONDS)
    assert bound.sizes == (10, 5)  # 13 wanted, 10 at most
    assert bound.lease_size(prefetched=6, held=6) == 0  # above the low water
    assert bound.lease_size(prefetched=5, held=5) == 5
    assert bound.lease_size(prefetched=0, held=7) == 3  # seven in hand: room for three
    assert bound.lease_size(prefetched=0, held=10) == 0


def test_prefetch_grows_with_the_receivers_seen_and_shrinks_once_they_are_gone():
    bound = PrefetchBound(max_prefetch=1000)
    bound.lease_took(LEASE_SECONDS, now=0.0)
    in_other_thread(lambda: bound.receiver_back(100.0))  # a second receiver, seen at 100 s
    handled(bound, delivered_at=100.0, seconds=HANDLING_SECONDS)
    assert bound.receivers(100.0 + HANDLING_SECONDS) == 2
    # Two receivers: a delivery every 0.03 s, need = ceil(0.5 / 0.03) = 17.
    assert bound.sizes == (25, 12)
    later = 100.0 + RECEIVERS_SEEN_SECONDS + 1
    handled(bound, delivered_at=later, seconds=HANDLING_SECONDS)
    assert bound.receivers(later + HANDLING_SECONDS) == 1
    assert bound.sizes == (13, 6)


def test_prefetch_measures_each_receiver_from_its_own_delivery():
    """A delivery to another thread is not this thread's: its return measures nothing."""
    bound = PrefetchBound(max_prefetch=1000)
    bound.lease_took(LEASE_SECONDS, now=0.0)
    in_other_thread(lambda: bound.delivered(5, 1.0))
    bound.receiver_back(1.0 + HANDLING_SECONDS)
    assert bound.handling_seconds is None and bound.sizes == (1, 0)
    bound.receiver_back(2.0)  # nothing delivered to it since its last return either
    assert bound.handling_seconds is None


# -- acknowledgements -------------------------------------------------------------------------


def test_the_acknowledgement_interval_defaults_to_a_second_or_a_quarter_lease_period():
    assert acknowledgement_interval_ms(None, 30_000) == DEFAULT_ACK_INTERVAL_MS == 1000
    assert acknowledgement_interval_ms(None, 2_000) == 500
    assert acknowledgement_interval_ms(4_999, 10_000) == 4_999
    with pytest.raises(InvalidOptionError, match=r"ack_interval \(5000 ms\) must be below"):
        acknowledgement_interval_ms(5_000, 10_000)


def test_acknowledgements_are_due_at_the_batch_size():
    pending = PendingAcknowledgements(batch_size=3, interval_seconds=1.0)
    assert not pending.due(0.0) and pending.wait_seconds(0.0) is None
    pending.add(1, 0.0)
    pending.add(2, 0.1)
    assert not pending.due(0.2)
    pending.add(3, 0.2)
    assert pending.due(0.2)
    assert pending.take() == [1, 2, 3]
    assert len(pending) == 0 and not pending.due(5.0) and pending.take() == []


def test_acknowledgements_are_due_once_the_oldest_waited_the_interval():
    pending = PendingAcknowledgements(batch_size=1000, interval_seconds=1.0)
    pending.add(4, 10.0)
    pending.add(5, 10.5)
    assert pending.wait_seconds(10.25) == 0.75  # from the oldest, not the newest
    assert not pending.due(10.999)
    assert pending.due(11.0)


def test_a_failed_flush_puts_its_acknowledgements_back_first():
    pending = PendingAcknowledgements(batch_size=1000, interval_seconds=1.0)
    pending.add(1, 0.0)
    taken = pending.take()
    pending.add(2, 5.0)  # acknowledged while the flush was in flight
    pending.put_back(taken, 5.5)
    assert not pending.due(5.9)  # waiting since the newer one, at 5.0
    assert pending.due(6.0)
    assert pending.take() == [1, 2]
    pending.put_back([3], 7.0)  # nothing pending: waiting from the failure on
    assert not pending.due(7.9) and pending.due(8.0)


def test_acknowledgements_retried_after_a_transient_failure_are_due_at_once():
    pending = PendingAcknowledgements(batch_size=1000, interval_seconds=1.0)
    pending.add(9, 20.0)
    pending.retry([7, 8], 20.0)
    assert pending.due(20.0)
    assert pending.take() == [7, 8, 9]


# -- lease renewal ----------------------------------------------------------------------------


def test_renewal_picks_exactly_the_leases_due():
    renewals = LeaseRenewals(lease_period_seconds=10.0)
    assert renewals.due(100.0) == [] and renewals.wait_seconds(0.0) is None
    renewals.track([1, 2], now=0.0)  # due half a lease period later: 5.0
    renewals.track([3], now=2.0)  # 7.0
    assert renewals.wait_seconds(1.0) == 4.0
    assert renewals.due(4.999) == []
    assert sorted(renewals.due(5.0)) == [1, 2]
    renewals.extending([1, 2], now=5.0)  # 10.0
    assert renewals.due(6.0) == []
    assert renewals.due(7.0) == [3]
    renewals.extending([3], now=7.0)  # 12.0
    renewals.forget(1)
    assert renewals.due(10.0) == [2]
    assert sorted(renewals.due(12.0)) == [2, 3]


def test_renewal_forgets_a_settled_message_and_moves_past_it():
    renewals = LeaseRenewals(lease_period_seconds=10.0)
    renewals.track([1], now=0.0)  # 5.0
    renewals.track([2], now=4.0)  # 9.0
    assert renewals.forget(1) == 5.0
    assert renewals.forget(1) is None
    assert renewals.due(5.0) == []  # the earliest was settled: found by one scan
    assert renewals.next_at == 9.0 and renewals.due(8.0) == []
    due_at = renewals.forget(2)
    assert renewals.due(9.0) == []
    renewals.restore(2, due_at)  # a nack that failed: held again, as due as before
    assert renewals.due(9.0) == [2]


def test_renewal_retried_after_a_transient_failure_is_due_at_once():
    renewals = LeaseRenewals(lease_period_seconds=10.0)
    renewals.track([1, 2], now=0.0)
    renewals.extending([1, 2], now=5.0)  # sent; due next at 10.0
    renewals.forget(2)  # acked while the extension was in flight
    renewals.retry([1, 2], now=6.0)
    assert renewals.due(6.0) == [1]  # the acked one stays forgotten
    assert len(renewals) == 1


# -- long polling -----------------------------------------------------------------------------


def test_the_longest_poll_interval_defaults_by_where_the_table_is(table):
    assert longest_poll_interval_ms(None, table) == LOCAL_POLL_MS
    assert longest_poll_interval_ms(40, table) == 40


def test_commits_that_can_feed_a_queue_are_told_from_those_that_cannot():
    assert operations_may_feed("q", ["PUBLISH q"])
    assert operations_may_feed("q", ["LEASE q", "PUBLISH q"])
    assert operations_may_feed("q", ["ENQUEUE"])  # names no queue: may touch any
    assert not operations_may_feed("q", ["PUBLISH other"])
    assert not operations_may_feed("q", ["LEASE q", "ACK q", "EXTEND q"])
    assert may_feed("q", ["PUBLISH"], ["q", "other"])
    assert may_feed("q", ["CANCEL"], None)  # the queues not recorded
    assert not may_feed("q", ["PUBLISH"], ["other"])
    assert not may_feed("q", ["LEASE", "ACK"], ["q"])


def test_the_log_watch_wakes_on_a_commit_that_can_feed_its_queue_only(table):
    table.publish("q", ["a"])
    watch = LogWatch(table, "q", table.store.open().version())
    assert not watch.moved()
    table.publish("other", ["x"])  # another queue
    seqs = table.lease("q", "c")["seq"].to_pylist()  # a lease and an ack of this queue
    table.ack("q", seqs, "c")
    before = watch.version
    assert not watch.moved()
    assert watch.version == before + 3  # read past all three
    table.publish("q", ["b"])
    assert watch.moved()
    assert not watch.moved()  # that commit is behind it now


def test_the_log_watch_of_no_version_starts_from_the_latest(table):
    table.publish("q", ["a"])
    watch = LogWatch(table, "q", None)
    assert not watch.moved()  # the publish is before it
    table.publish("q", ["b"])
    assert watch.moved()


def test_the_commit_listener_hears_this_process_s_commits_until_closed(table):
    heard: list[list[str]] = []
    listener = CommitListener(table, heard.append)
    table.publish("q", ["a"])
    table.publish("other", ["b"])
    assert [operations_may_feed("q", operations) for operations in heard] == [True, False]
    listener.close()
    table.publish("q", ["c"])
    assert len(heard) == 2


def test_the_long_poll_leases_when_woken_or_at_the_idle_interval():
    poll = LongPoll(max_interval_seconds=0.025, idle_lease_interval_seconds=1.0)
    assert not poll.idle and poll.lease_due(0.0)
    assert poll.log_check(100.0) is None  # not idle: nothing to check
    poll.lease_found(0, watch=None, now=10.0)
    assert poll.idle
    assert not poll.lease_due(10.5)
    assert poll.lease_due(11.0)
    poll.wake()
    assert poll.lease_due(10.1)
    poll.leasing()
    assert not poll.lease_due(10.2)  # the wake was used up
    poll.lease_found(4, watch=None, now=10.3)
    assert not poll.idle and poll.lease_due(10.3)


def test_a_wake_while_the_prefetch_is_full_lasts_until_a_lease_goes():
    """An idle consumer woken while it holds all it may prefetch leases nothing then; the
    wake waits, without log checks or a busy loop, for a receiver to make room."""
    poll = LongPoll(max_interval_seconds=0.025, idle_lease_interval_seconds=3600.0)
    poll.lease_found(0, watch=None, now=10.0)
    poll.wake()
    assert poll.lease_due(10.1)  # nothing leased: the prefetch is full
    assert poll.wait_seconds(10.1) == 3600.0 and poll.log_check(10.1) is None
    assert poll.lease_due(12.0)  # room made: the lease goes
    poll.leasing()
    assert not poll.lease_due(12.1)


def test_the_long_poll_checks_the_log_at_doubling_intervals_up_to_the_longest(table):
    watch = LogWatch(table, "q", table.store.open().version())
    poll = LongPoll(max_interval_seconds=0.025, idle_lease_interval_seconds=1.0)
    poll.lease_found(0, watch, now=10.0)
    first = 10.0 + FIRST_POLL_INTERVAL_SECONDS
    assert poll.wait_seconds(10.0) == pytest.approx(FIRST_POLL_INTERVAL_SECONDS)
    assert poll.log_check(first - 0.001) is None
    assert poll.log_check(first) is watch and poll.checks == 1
    intervals = []
    for _ in range(4):
        poll.checked(moved=False, now=10.5)
        intervals.append(round(poll.check_at - 10.5, 6))
    assert intervals == [0.01, 0.02, 0.025, 0.025]
    assert not poll.lease_due(10.5)  # the log did not move, and the idle interval is 1 s
    poll.checked(moved=True, now=10.5)  # the log moved: lease, and check no more meanwhile
    assert poll.log_check(10.9) is None and poll.checks == 1
    assert poll.lease_due(10.5)
    poll.lease_found(0, watch, now=21.0)  # found nothing again: the intervals go on
    assert poll.check_at == pytest.approx(21.0 + 0.025)
    poll.lease_found(1, None, now=22.0)  # found messages: they start over
    assert poll.interval_seconds == FIRST_POLL_INTERVAL_SECONDS and poll.watch is None
    assert poll.wait_seconds(22.0) == 1.0
