"""SchedulerState: admission, batching order, splitting, cancellation bookkeeping, failures."""

import numpy as np
import pytest

from engine.errors import RejectKind
from engine.host import planning
from engine.host.buckets import Buckets
from engine.host.kv_cache import KVCache
from engine.kinds import Layout, Output
from engine.messages import BatchDone, Cancel, Rejected, Scored, Tokenized
from engine.scheduler import SCORING, SchedulerState

BUCKETS = Buckets(block_size=8, tokens=(16, 32, 64, 128))


def tokenized(i, seqs, labels=(1,)):
    return Tokenized(id=i, sequences=seqs, labels=list(labels), arrived=0.0, tokenize_s=0.001)


def state(budget=64, max_tokens=1000):
    return SchedulerState(BUCKETS, token_budget=budget, max_queued_tokens=max_tokens)


def done_for(batch, value=-1.0):
    s, width = batch.inputs.label_ids.shape
    return BatchDone(id=batch.id, outputs=np.full((s, width), value, np.float32), device_s=0.01)


def test_requests_are_batched_in_arrival_order_and_completed():
    st = state()
    assert st.handle(tokenized(0, [[1, 2, 3], [1, 2, 4]]), 0.0) == []
    assert st.handle(tokenized(1, [[9, 9]]), 0.0) == []
    batch = st.next_batch(1.0)
    assert sorted(batch.rows) == [(0, 0), (0, 1), (1, 0)]
    assert batch.real_tokens == 2 + 1 + 1 + 2  # prefix [1, 2] once
    assert st.stats.prefix_tokens_saved == 2
    assert st.next_batch(1.0) is None
    out = st.handle(done_for(batch), 2.0)
    assert {m.id for m in out} == {0, 1} and all(isinstance(m, Scored) for m in out)
    scored = {m.id: m for m in out}[0]
    assert [row[:1].tolist() for row in scored.outputs] == [[-1.0], [-1.0]]  # its label
    assert scored.prompt_tokens == 6
    assert scored.timings.queue == 1.0 and scored.timings.device == 0.01
    assert not st.requests and not st.queue and not st.in_flight


def test_a_request_larger_than_the_budget_spans_batches():
    st = state(budget=16)
    st.handle(tokenized(0, [[i] * 10 for i in range(1, 6)]), 0.0)
    batches = []
    while (b := st.next_batch(0.0)) is not None:
        batches.append(b)
    assert len(batches) == 5 and st.queued_tokens == 0
    outs = [m for b in batches for m in st.handle(done_for(b), 1.0)]
    assert [type(m) for m in outs] == [Scored]
    assert len(outs[0].outputs) == 5


def answered(batch):
    """The batch's outputs: each row holds 100 * its request id + its item index."""
    s, width = batch.inputs.label_ids.shape
    outputs = np.full((s, width), -1.0, np.float32)
    for row, (rid, idx) in enumerate(batch.rows):
        outputs[row] = 100 * rid + idx
    return BatchDone(id=batch.id, outputs=outputs, device_s=0.01)


def test_a_request_over_batches_of_different_label_widths_gets_each_row_once():
    st = state(budget=32)
    st.handle(tokenized(0, [[i] * 10 for i in range(1, 5)]), 0.0)  # one label, two batches
    first = st.next_batch(0.0)
    st.handle(tokenized(1, [[9] * 3], labels=range(1, 7)), 0.0)  # six: a wider second batch
    second = st.next_batch(0.0)
    narrow, wide = first.inputs.label_ids.shape[1], second.inputs.label_ids.shape[1]
    assert narrow < wide and {rid for rid, _ in second.rows} == {0, 1}
    (one,) = st.handle(answered(second), 1.0)  # the wider batch is answered first
    assert one.id == 1 and one.outputs.tolist() == [[100.0] * wide]
    (zero,) = st.handle(answered(first), 2.0)
    assert zero.outputs.shape == (4, narrow)  # every batch's width holds its one label
    assert zero.outputs[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_overload_rejects_past_the_token_bound():
    st = state(max_tokens=10)
    assert st.handle(tokenized(0, [[1] * 8]), 0.0) == []
    (rejected,) = st.handle(tokenized(1, [[1] * 3]), 0.0)
    assert (
        rejected.kind is RejectKind.OVERLOADED and "8 tokens waiting (limit 10)" in rejected.message
    )
    assert 1 not in st.requests


def test_cancel_of_a_queued_request_drops_it():
    st = state()
    st.handle(tokenized(3, [[1, 2]]), 0.0)
    assert st.handle(Cancel(id=3), 0.0) == []
    assert not st.requests and st.queued_tokens == 0 and st.next_batch(0.0) is None
    assert st.idle() and st.received == 2


def test_cancel_of_a_finished_request_leaves_nothing_behind():
    st = state()
    rejected = Rejected(id=5, kind=RejectKind.INVALID, message="bad", field="items")
    assert st.handle(rejected, 0.0) == [rejected]
    st.handle(Cancel(id=5), 0.0)
    st.handle(Cancel(id=2), 0.0)  # finished long ago
    assert st.idle() and st.received == 3


def test_cancel_in_flight_discards_its_rows():
    st = state()
    st.handle(tokenized(0, [[1, 2]]), 0.0)
    st.handle(tokenized(1, [[3, 4]]), 0.0)
    batch = st.next_batch(0.0)
    st.handle(Cancel(id=0), 0.0)
    out = st.handle(done_for(batch), 1.0)
    assert [m.id for m in out] == [1]
    assert not st.requests and not st.in_flight


def test_a_failed_batch_fails_its_requests_only():
    st = state(budget=16)
    st.handle(tokenized(0, [[1] * 10]), 0.0)
    st.handle(tokenized(1, [[2] * 10, [3] * 10]), 0.0)
    first = st.next_batch(0.0)
    assert [rid for rid, _ in first.rows] == [0]
    out = st.handle(BatchDone(id=first.id, error="RuntimeError: boom"), 0.0)
    failed = "device step failed: RuntimeError: boom"
    assert out == [Rejected(id=0, kind=RejectKind.FAILED, message=failed)]
    assert set(st.requests) == {1}


def test_fail_waiting_empties_the_head_of_the_queue():
    st = state()
    st.handle(tokenized(0, [[1]]), 0.0)
    out = st.fail_waiting(ValueError("oops"))
    assert (
        out[0].kind is RejectKind.FAILED
        and "batch build failed: ValueError: oops" in out[0].message
    )
    assert not st.requests and not st.queue and st.queued_tokens == 0


def test_unknown_messages_are_a_bug():
    with pytest.raises(TypeError, match="unexpected str"):
        state().handle("hello", 0.0)


def test_one_plan_serves_many_batches_until_the_queue_changes(monkeypatch):
    calls = []
    real_plan = planning.plan
    monkeypatch.setattr(planning, "plan", lambda *a, **k: calls.append(1) or real_plan(*a, **k))
    st = state(budget=16)
    st.handle(tokenized(0, [[i] * 10 for i in range(1, 7)]), 0.0)
    st.next_batch(0.0)
    st.next_batch(0.0)
    assert len(calls) == 1
    st.handle(tokenized(1, [[9] * 3]), 0.0)  # an arrival re-plans, keeping arrival order
    b = st.next_batch(0.0)
    assert len(calls) == 2 and b.rows[0][0] == 0
    st.handle(Cancel(id=0), 0.0)  # so does a cancellation
    b = st.next_batch(0.0)
    assert len(calls) == 3 and b.rows == [(1, 0)]


def test_a_request_bigger_than_the_whole_queue_is_too_large():
    (rejected,) = state(max_tokens=10).handle(tokenized(0, [[1] * 11]), 0.0)
    assert (rejected.kind, rejected.field) == (RejectKind.TOO_LARGE, "items")
    assert rejected.message == "11 tokens exceed the queue limit of 10"


def test_batch_wait_builds_at_once_for_a_lone_request():
    st = SchedulerState(BUCKETS, token_budget=64, max_queued_tokens=1000, linger=0.02)
    assert st.batch_wait(0.0) is None  # nothing queued
    st.handle(tokenized(0, [[1, 2, 3]]), 0.0)
    assert st.batch_wait(0.0) == 0.0


def test_batch_wait_lets_the_queue_grow_while_the_device_is_busy():
    st = SchedulerState(BUCKETS, token_budget=64, max_queued_tokens=1000, linger=0.02)
    st.handle(tokenized(0, [[1, 2, 3]]), 0.0)
    first = st.next_batch(0.0)
    st.handle(tokenized(1, [[4, 5]]), 0.1)
    assert st.batch_wait(0.1) is None  # device busy, less than a budget queued: wait
    st.handle(tokenized(2, [[6] * 70]), 0.2)  # now a full budget waits: build ahead
    assert st.batch_wait(0.2) == 0.0
    st.handle(done_for(first), 0.3)
    assert st.cohort == 3 and st.last_done_at == 0.3  # 2 waiting + 1 answered


def test_batch_wait_builds_the_rest_of_a_running_request_ahead():
    st = SchedulerState(BUCKETS, token_budget=32, max_queued_tokens=1000, linger=0.02)
    st.handle(tokenized(0, [[i] * 10 for i in range(1, 5)]), 0.0)  # 40 tokens: two batches
    first = st.next_batch(0.0)
    assert st.queue and st.queued_tokens < st.token_budget
    assert st.batch_wait(0.0) == 0.0  # less than a budget, but its answer waits for it
    rest = st.next_batch(0.0)
    assert st.assigned == [2] and st.batch_wait(0.0) is None  # one ahead at most
    st.handle(tokenized(1, [[7, 7]]), 0.0)  # a request not begun waits for the device
    assert st.batch_wait(0.0) is None
    (scored,) = [m for b in (first, rest) for m in st.handle(done_for(b), 1.0)]
    assert scored.id == 0 and len(scored.outputs) == 4


def test_the_rest_of_a_burst_does_not_linger_for_the_cohort_it_belongs_to():
    st = SchedulerState(BUCKETS, token_budget=32, max_queued_tokens=1000, linger=0.05)
    for i in range(3):  # 3 x 12 tokens: the budget cuts the third request
        st.handle(tokenized(i, [[i + 1] * 6, [i + 20] * 6]), 0.0)
    first = st.next_batch(0.0)
    finished = st.handle(done_for(first), 1.0)
    assert len(finished) == 2 and st.cohort == 3 and len(st.queue) == 1
    assert st.batch_wait(1.0) == 0.0  # its caller waits for it: no linger


def test_batch_wait_lingers_for_the_cohort_it_just_answered():
    st = SchedulerState(BUCKETS, token_budget=64, max_queued_tokens=1000, linger=0.02)
    for i in range(3):
        st.handle(tokenized(i, [[i + 1, 7]]), 0.0)
    batch = st.next_batch(0.0)
    assert len(st.handle(done_for(batch), 1.0)) == 3
    st.handle(tokenized(3, [[9, 9]]), 1.005)  # the first of the three clients is back
    assert st.batch_wait(1.005) == pytest.approx(0.015)
    st.handle(tokenized(4, [[9, 8]]), 1.01)
    assert st.batch_wait(1.01) == pytest.approx(0.01)
    assert st.batch_wait(1.03) == 0.0  # the linger ran out: batch what is there
    st.handle(tokenized(5, [[9, 7]]), 1.011)
    assert st.batch_wait(1.011) == 0.0  # the whole cohort is back


def test_the_cohort_counts_requests_already_waiting():
    st = SchedulerState(BUCKETS, token_budget=64, max_queued_tokens=1000, linger=0.02)
    for i in range(2):
        st.handle(tokenized(i, [[i + 1, 7]]), 0.0)
    batch = st.next_batch(0.0)
    st.handle(tokenized(2, [[5, 5]]), 0.5)  # arrived while the device worked
    st.handle(done_for(batch), 1.0)
    assert st.cohort == 3
    st.handle(tokenized(3, [[9, 9]]), 1.005)
    assert st.batch_wait(1.005) == pytest.approx(0.015)  # 2 queued of the 3 expected
    st.handle(tokenized(4, [[9, 8]]), 1.006)
    assert st.batch_wait(1.006) == 0.0


def test_no_linger_by_default():
    st = state()
    for i in range(3):
        st.handle(tokenized(i, [[i + 1, 7]]), 0.0)
    st.handle(done_for(st.next_batch(0.0)), 1.0)
    st.handle(tokenized(3, [[9, 9]]), 1.001)
    assert st.batch_wait(1.001) == 0.0


def runners_state(caches: int = 2) -> SchedulerState:
    buckets = BUCKETS._replace(contexts=(0, 64, 256))
    caches = [KVCache(64, 8, max_context=256) for _ in range(caches)]
    layouts = {**SCORING, Output.TOKENS: Layout.ALONE}  # a last-token embedder's
    return SchedulerState(
        buckets, token_budget=64, max_queued_tokens=1000, caches=caches, layouts=layouts
    )


def test_a_batch_goes_to_the_free_runner_whose_cache_holds_its_prefix():
    st = runners_state()
    prompt = list(range(1, 25))  # three pages of 8
    st.handle(tokenized(0, [prompt + [30], prompt + [31]]), 0.0)
    assert st.pick_runner() == 0  # nothing cached anywhere: the first, least used runner
    first = st.next_batch(0.0, runner=1)
    assert st.assigned == [0, 1] and st.runner_batches == [0, 1]
    st.handle(done_for(first), 1.0)  # runner 1 now caches the prompt
    assert st.assigned == [0, 0] and st.caches[1].peek(prompt) == 24
    st.handle(tokenized(1, [prompt + [40]]), 2.0)
    assert st.pick_runner() == 1  # affinity beats use
    batch = st.next_batch(2.0, runner=1)
    (scored,) = st.handle(done_for(batch), 3.0)
    assert scored.cached_tokens == 24 and st.caches[0].peek(prompt) == 0


def test_a_busy_runner_is_handed_one_batch_ahead_at_most():
    st = runners_state()
    st.handle(tokenized(0, [[i] * 30 for i in range(1, 9)]), 0.0)  # several batches of work
    picks = []
    for _ in range(4):
        picks.append(st.pick_runner())
        assert st.next_batch(0.0, picks[-1]) is not None
    assert picks[:2] == [0, 1]  # free runners first
    assert st.assigned == [2, 2] and st.pick_runner() is None
    assert st.batch_wait(0.0) is None  # everything waits for a runner


def test_a_lost_pool_voids_only_its_runners_cache():
    st = runners_state()
    st.handle(tokenized(0, [[5] * 20 + [1]]), 0.0)
    st.handle(done_for(st.next_batch(0.0, runner=0)), 1.0)
    st.handle(tokenized(1, [[5] * 20 + [2]]), 1.0)
    batch = st.next_batch(1.0, runner=1)
    assert st.caches[0].peek([5] * 20) == 16
    failed = BatchDone(id=batch.id, error="boom", pool_reset=True)
    (rejected,) = st.handle(failed, 2.0)
    assert rejected.kind is RejectKind.FAILED
    assert st.pool_generation == [0, 1] and st.caches[0].peek([5] * 20) == 16


def test_token_state_requests_run_in_batches_of_their_own_and_answer_each_token():
    """Requests for token states are never batched with score requests, share no prefix, read
    no cache, and answer each sequence's rows of the batch's f32[T, E] states."""
    st = runners_state(1)
    shared = list(range(1, 17))  # two pages of 8
    st.handle(tokenized(0, [shared + [30], shared + [31]]), 0.0)
    states = Tokenized(
        id=1,
        sequences=[shared + [32], shared + [33, 34]],
        labels=[],
        arrived=0.0,
        tokenize_s=0.0,
        output=Output.TOKENS,
    )
    st.handle(states, 0.0)
    st.handle(tokenized(2, [shared + [35]]), 0.0)
    first = st.next_batch(1.0)
    assert first.output is Output.LOGPROBS and sorted(first.rows) == [(0, 0), (0, 1)]
    st.handle(done_for(first), 1.5)  # the shared pages are cached now
    second, third = st.next_batch(2.0), st.next_batch(2.0)
    assert st.next_batch(2.0) is None
    assert second.output is Output.TOKENS and third.output is Output.LOGPROBS
    assert third.rows == [(2, 0)]
    assert second.real_tokens == 17 + 18  # each laid out whole, nothing read from the cache
    t = second.inputs.tokens.shape[0]
    hidden = np.arange(t * 2, dtype=np.float32).reshape(t, 2)  # f32[T, E]: token i is [2i, 2i+1]
    (scored,) = st.handle(BatchDone(id=second.id, outputs=hidden, device_s=0.01), 3.0)
    assert scored.id == 1 and scored.cached_tokens == 0 and scored.prompt_tokens == 35
    tokens = second.inputs.tokens
    for seq, answer in zip(states.sequences, scored.outputs, strict=True):
        assert answer.shape == (len(seq), 2)
        at = (answer[:, 0] / 2).astype(int)  # the batch position each answered row came from
        assert tokens[at].tolist() == seq and at.tolist() == list(range(at[0], at[0] + len(seq)))
    (last,) = st.handle(done_for(third), 3.0)
    assert last.cached_tokens == 16  # the score request after it still reads the cache


def test_a_window_goes_on_after_its_first_request_finished():
    """Later batches of one planned window are taken after its first request is answered (and
    forgotten): the window keeps what kind of batches it makes."""
    st = state(budget=16)
    st.handle(tokenized(0, [[1] * 10]), 0.0)
    st.handle(tokenized(1, [[2] * 10]), 0.0)
    first = st.next_batch(0.0)
    (done,) = st.handle(done_for(first), 1.0)
    assert done.id == 0 and 0 not in st.requests
    second = st.next_batch(1.0)
    assert second.rows == [(1, 0)] and second.output is Output.LOGPROBS
