"""Where a request should go: the prefix key of its prompt, which replicas hold it, the ranking.

A request's key is a chain of hashes over its query in fixed blocks (256 characters of text, or
64 token ids), at most 16 blocks: hash i covers blocks 0..i, so two queries that share their
first k blocks share their first k hashes, and the deepest hash a replica holds says how long a
prefix of the query its KV cache can give back (a paged KV cache's block hashes, at the
router's level, in characters instead of tokens).

Plain state, no Ray: `PrefixTable` keeps what each replica holds (as it reported, and as routed
from here since), `rank` orders the replicas for one request. `api.ray_serve.router` wraps them
in Ray Serve's request-router interface.
"""

import hashlib
import random
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, Literal, TypeVar

import msgspec
import numpy as np

BLOCK_CHARS = 256
BLOCK_IDS = 64
MAX_BLOCKS = 16

Key = tuple[int, ...]
R = TypeVar("R", bound=Hashable)
Strategy = Literal["prefix", "hash"]
STRATEGIES: tuple[str, ...] = ("prefix", "hash")


class _Prompt(msgspec.Struct):
    """The fields that carry the shared part of a prompt, in every route's request body."""

    query: Any = None  # /v1/score, every rerank route
    text_1: Any = None  # vLLM's /score


_PROMPT = msgspec.json.Decoder(_Prompt)


def prefix_key(body: bytes) -> Key:
    """The chain of block hashes of the request's query; () when it has none (or is not JSON:
    the replica answers that 400)."""
    try:
        prompt = _PROMPT.decode(body)
    except msgspec.MsgspecError:
        return ()
    query = prompt.query if prompt.query is not None else prompt.text_1
    if isinstance(query, list) and len(query) == 1 and isinstance(query[0], str):
        query = query[0]  # vLLM's one-query list
    if isinstance(query, str):
        return _chain(_text_blocks(query))
    if isinstance(query, list) and query and all(type(t) is int for t in query):
        return _chain(_id_blocks(query))
    return ()


def _text_blocks(text: str) -> Iterable[bytes]:
    ends = range(0, min(len(text), BLOCK_CHARS * MAX_BLOCKS), BLOCK_CHARS)
    return (text[i : i + BLOCK_CHARS].encode("utf-8", "surrogatepass") for i in ends)


def _id_blocks(ids: list[int]) -> Iterable[bytes]:
    array = np.asarray(ids[: BLOCK_IDS * MAX_BLOCKS], dtype=np.int64)  # [n]
    return (array[i : i + BLOCK_IDS].tobytes() for i in range(0, len(array), BLOCK_IDS))


def _chain(blocks: Iterable[bytes]) -> Key:
    hashes, digest = [], b""
    for block in blocks:
        digest = hashlib.blake2b(digest + block, digest_size=8).digest()
        hashes.append(int.from_bytes(digest, "little"))
    return tuple(hashes)


class PrefixTable:
    """Which replicas hold which prefix hashes: each replica's last report, and what was routed
    from here since (an LRU of `capacity` hashes), so affinity holds between reports."""

    def __init__(self, capacity: int = 65536):
        self.capacity = capacity
        self._routed: OrderedDict[int, set] = OrderedDict()  # hash -> replicas routed to
        self._reported: dict[Hashable, frozenset[int]] = {}

    def report(self, replica: Hashable, hashes: Iterable[int]) -> None:
        """Replace what `replica` says it holds."""
        self._reported[replica] = frozenset(hashes)

    def routed(self, key: Key, replica: Hashable) -> None:
        """`key`'s request went to `replica`: it will hold the prefix."""
        for h in key:
            self._routed.setdefault(h, set()).add(replica)
            self._routed.move_to_end(h)
        while len(self._routed) > self.capacity:
            self._routed.popitem(last=False)

    def forget(self, replica: Hashable) -> None:
        """`replica` is gone (or restarted empty)."""
        self._reported.pop(replica, None)
        for holders in self._routed.values():
            holders.discard(replica)

    def depth(self, key: Key, replica: Hashable) -> int:
        """How many leading blocks of `key` `replica` holds."""
        reported = self._reported.get(replica, frozenset())
        for i in range(len(key) - 1, -1, -1):
            if key[i] in reported or replica in self._routed.get(key[i], ()):
                return i + 1
        return 0


def rank(
    key: Key,
    replicas: Sequence[R],
    load: Callable[[R], int],
    table: PrefixTable,
    *,
    strategy: Strategy = "prefix",
    imbalance: int = 8,
    min_match: float = 0.5,
) -> list[list[R]]:
    """The replicas to try for one request: the chosen one alone, then the rest least loaded
    first (ties in random order, so new prefixes spread).

    The chosen one is the preferred replica unless its load exceeds the least load by more than
    `imbalance` requests; else the least-loaded replica. Preferred: the deepest holder of the
    key's prefix when it holds at least `min_match` of the key's blocks (a shared system prompt
    alone is not worth sending everything to one replica), or under `strategy="hash"` the key's
    rendezvous-hash owner.
    """
    by_load = sorted(replicas, key=lambda r: (load(r), random.random()))
    if not by_load:
        return []
    chosen = _preferred(key, by_load, table, strategy, min_match)
    if chosen is None or load(chosen) > load(by_load[0]) + imbalance:
        chosen = by_load[0]
    return [[chosen], [r for r in by_load if r != chosen]]


def _preferred(
    key: Key, by_load: list[R], table: PrefixTable, strategy: Strategy, min_match: float
) -> R | None:
    if not key:
        return None
    if strategy == "hash":
        return max(by_load, key=lambda r: _owner_weight(key[-1], r))
    depths = [table.depth(key, r) for r in by_load]
    deepest = max(depths)
    if deepest == 0 or deepest < min_match * len(key):
        return None
    return by_load[depths.index(deepest)]  # the least loaded of the deepest


def _owner_weight(h: int, replica: Hashable) -> bytes:
    # rendezvous hashing: a replica that leaves moves only its own keys
    return hashlib.blake2b(f"{h}:{replica}".encode(), digest_size=8).digest()
