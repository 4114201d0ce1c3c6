"""The prefix-affinity policy (`api.ray_serve.routing`) without Ray: keys, the prefix table, the
ranking; and the queue-depth autoscaling policy."""

import json
from collections import Counter
from types import SimpleNamespace

import pytest

from api.ray_serve.autoscaling import QueueDepthPolicy
from api.ray_serve.routing import (
    BLOCK_CHARS,
    BLOCK_IDS,
    MAX_BLOCKS,
    PrefixTable,
    prefix_key,
    rank,
)


def key_of(body: dict) -> tuple[int, ...]:
    return prefix_key(json.dumps(body).encode())


def test_the_key_is_a_chain_over_blocks_of_the_query():
    text = "".join(chr(0x41 + i % 26) for i in range(3 * BLOCK_CHARS + 10))
    key = key_of({"query": text, "items": ["a"]})
    assert len(key) == 4  # three whole blocks and the rest
    # a query that shares the first two blocks shares the first two hashes, no more
    other = key_of({"query": text[: 2 * BLOCK_CHARS] + "x" + text[2 * BLOCK_CHARS + 1 :]})
    assert other[:2] == key[:2] and other[2] != key[2] and other[3] != key[3]
    # the same block at another depth hashes differently (the chain covers what came before)
    repeated = key_of({"query": "z" * (2 * BLOCK_CHARS)})
    assert repeated[0] != repeated[1]
    # stable across processes (no per-process hash seed) and independent of the other fields
    assert key == key_of({"documents": ["d"], "query": text, "top_n": 1})


def test_keys_of_every_route_and_of_token_ids():
    assert key_of({"query": "q", "documents": ["a"]}) == key_of({"query": "q", "items": ["b"]})
    assert key_of({"text_1": "q", "text_2": ["a"]}) == key_of({"query": "q"})  # vLLM /score
    assert key_of({"text_1": ["q"], "text_2": ["a"]}) == key_of({"query": "q"})
    ids = list(range(2 * BLOCK_IDS + 1))
    assert len(key_of({"query": ids})) == 3
    assert key_of({"query": ids})[:2] == key_of({"query": ids[: 2 * BLOCK_IDS]})
    assert key_of({"query": "x" * (BLOCK_CHARS * (MAX_BLOCKS + 5))}) == key_of(
        {"query": "x" * (BLOCK_CHARS * MAX_BLOCKS)}
    )  # at most MAX_BLOCKS blocks: the rest of a long query does not change its key


NO_QUERY = [b"{", b"[]", b'{"query": 3}', b'{"query": ""}', b'{"items": ["a"]}']
NO_QUERY += [b'{"query": [1, "a"]}', b'{"query": {"text": "q"}}']


@pytest.mark.parametrize("body", NO_QUERY)
def test_no_key_for_a_body_without_a_usable_query(body):
    assert prefix_key(body) == ()


def test_the_table_knows_reports_and_its_own_routing():
    table = PrefixTable(capacity=4)
    a, b = key_of({"query": "a" * 3 * BLOCK_CHARS}), key_of({"query": "b" * BLOCK_CHARS})
    table.report("r1", a[:2])
    assert [table.depth(a, r) for r in ("r1", "r2")] == [2, 0]
    table.routed(a, "r2")
    assert [table.depth(a, r) for r in ("r1", "r2")] == [2, 3]
    table.report("r1", [])  # a new report replaces the old
    assert table.depth(a, "r1") == 0
    table.routed(b, "r1")
    table.routed(key_of({"query": "c" * 3 * BLOCK_CHARS}), "r1")  # 7 hashes in a table of 4
    assert table.depth(b, "r1") == 1 and table.depth(a, "r2") == 0  # a's went first
    table.forget("r1")
    assert table.depth(b, "r1") == 0


def test_rank_prefers_the_deepest_holder_unless_overloaded():
    table = PrefixTable()
    key = key_of({"query": "q" * 2 * BLOCK_CHARS})
    loads = {"r1": 0, "r2": 5, "r3": 1}
    table.report("r3", key[:1])
    table.report("r2", key)
    ranks = rank(key, list(loads), loads.get, table, imbalance=8)
    assert ranks == [["r2"], ["r1", "r3"]]  # deepest holder, then the rest by load
    assert rank(key, list(loads), loads.get, table, imbalance=4) == [["r1"], ["r3", "r2"]]
    # two equally deep holders: the less loaded one
    table.report("r1", key)
    assert rank(key, list(loads), loads.get, table)[0] == ["r1"]
    # no key, or nobody holds it: every replica, least loaded first
    assert rank((), list(loads), loads.get, table) == [["r1"], ["r3", "r2"]]
    assert rank((7,), list(loads), loads.get, table) == [["r1"], ["r3", "r2"]]
    assert rank(key, [], loads.get, table) == []


def test_a_short_shared_start_is_no_reason_to_prefer_a_replica():
    table = PrefixTable()
    header = "You are a careful judge of relevance. " * 7  # one block shared by every user
    users = [key_of({"query": header + f"user {i}: " * 600}) for i in range(2)]
    assert users[0][0] == users[1][0] and len(users[0]) == MAX_BLOCKS
    table.routed(users[0], "r1")
    loads = {"r1": 1, "r2": 0}
    assert rank(users[1], ["r1", "r2"], loads.get, table)[0] == ["r2"]  # 1 block of 16 held
    assert rank(users[1], ["r1", "r2"], loads.get, table, min_match=0.0)[0] == ["r1"]
    assert rank(users[0], ["r1", "r2"], loads.get, table)[0] == ["r1"]  # all of it held


def test_new_prefixes_spread_over_idle_replicas():
    table = PrefixTable()
    replicas = ["r1", "r2", "r3"]
    firsts = Counter(rank((i,), replicas, lambda r: 0, table)[0][0] for i in range(300))
    assert set(firsts) == set(replicas) and min(firsts.values()) > 50


def test_rendezvous_hashing_is_stable_and_moves_only_a_lost_replicas_keys():
    table = PrefixTable()
    replicas = [f"replica-{i}" for i in range(4)]
    keys = [key_of({"query": f"query {i}"}) for i in range(400)]

    def owner(key, among):
        return rank(key, among, lambda r: 0, table, strategy="hash")[0][0]

    owners = {k: owner(k, replicas) for k in keys}
    assert all(owner(k, list(reversed(replicas))) == owners[k] for k in keys)
    assert min(Counter(owners.values()).values()) > 60  # spread over all four
    survivors = replicas[1:]
    moved = [k for k in keys if owner(k, survivors) != owners[k]]
    assert moved == [k for k in keys if owners[k] == replicas[0]]
    # an overloaded owner gives way to the least loaded
    loads = dict.fromkeys(replicas, 0) | {owners[keys[0]]: 20}
    assert (
        rank(keys[0], replicas, loads.get, table, strategy="hash", imbalance=8)[0][0]
        != (owners[keys[0]])
    )


def context(queued: dict, in_flight: dict, state=None):
    return SimpleNamespace(
        aggregated_metrics={"queued_tokens": queued, "in_flight": in_flight},
        policy_state=state or {},
    )


def test_queue_depth_policy():
    policy = QueueDepthPolicy(target_queued_tokens=1000)
    assert policy(context({"a": 0.0, "b": 0.0}, {"a": 0.0, "b": 0.0})) == (0, {})
    assert policy(context({"a": 2500.0, "b": 10.0}, {"a": 3.0, "b": 1.0}))[0] == 3
    # busy replicas with empty queues are kept
    assert policy(context({"a": 0.0, "b": 0.0}, {"a": 2.0, "b": 1.0}))[0] == 2
    assert policy(SimpleNamespace(aggregated_metrics=None, policy_state={"k": 1})) == (0, {"k": 1})
    with pytest.raises(ValueError, match="target_queued_tokens must be positive"):
        QueueDepthPolicy(0)
