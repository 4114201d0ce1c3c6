"""Host hot paths: compiled Cython modules with pure-Python twins of the same signature.

The compiled modules are used when they were built; otherwise the twins are, and `COMPILED` says
which. `IMPLEMENTATIONS` holds both (by name) so tests can run every function through each.

- `pick_bucket(buckets, n)`: the smallest padding bucket >= n.
- `group_by_prefix(seqs)`: `(prefix_len, members)` groups sharing a token prefix (the compiled
  form is C++, `prefix_groups.h`).
- `join_ids(query, items, item_first, vocab_size)`: a request's id lists joined into int32
  sequences, each id checked against the vocabulary.
- `pack_chunks(seqs, chunks)`: the unpadded flat arrays of one packed batch.
- `PrefixCache(num_pages, page_size)`: the KV pool's page allocator and radix prefix cache.

Two more compiled modules are imported where they are used, each beside its other form:
`_schedule` (the attention block schedule; numpy form in `score_kernels.schedule`) and `_byte_bpe`
(byte-level BPE encoding; the other form is `tokenizers` itself, `engine.text.native_tokenizer`).
"""

from types import SimpleNamespace

from . import _buckets_py, _join_py, _pack_py, _prefix_cache_py, _prefix_groups_py

try:
    from . import _buckets, _join, _pack, _prefix_cache, _prefix_groups
except ImportError:  # not built (e.g. a source checkout without `pip install -e .`)
    _buckets = _join = _pack = _prefix_cache = _prefix_groups = None


def _implementation(buckets, prefix_groups, join, pack, prefix_cache) -> SimpleNamespace:
    return SimpleNamespace(
        pick_bucket=buckets.pick_bucket,
        group_by_prefix=prefix_groups.group_by_prefix,
        join_ids=join.join_ids,
        pack_chunks=pack.pack_chunks,
        PrefixCache=prefix_cache.PrefixCache,
    )


COMPILED = _prefix_groups is not None
IMPLEMENTATIONS = {
    "python": _implementation(_buckets_py, _prefix_groups_py, _join_py, _pack_py, _prefix_cache_py)
}
if COMPILED:
    IMPLEMENTATIONS["native"] = _implementation(
        _buckets, _prefix_groups, _join, _pack, _prefix_cache
    )
_chosen = IMPLEMENTATIONS["native" if COMPILED else "python"]

pick_bucket = _chosen.pick_bucket
group_by_prefix = _chosen.group_by_prefix
join_ids = _chosen.join_ids
pack_chunks = _chosen.pack_chunks
PrefixCache = _chosen.PrefixCache

__all__ = [
    "COMPILED",
    "IMPLEMENTATIONS",
    "PrefixCache",
    "group_by_prefix",
    "join_ids",
    "pack_chunks",
    "pick_bucket",
]
