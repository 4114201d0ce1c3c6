"""Model FLOPs, counted honestly: what a forward must compute on real (non-padding) tokens.

Per real token: 2 x the non-embedding matmul parameters (q/k/v/o projections and the MLP), plus
attention: 2 x 2 x keys-seen x head_dim x heads per layer (QK^T and PV, causal: a token sees its
own position and those before it). The LM head (2 x hidden x vocab) counts only for score rows;
the embedding lookup counts nothing. Norms, RoPE, softmax and biases are left out (<1%).

An encoder (cross-encoder) is counted by `encoder_flops`: the same dense FLOPs per token, but
each token attends to its whole pair (a local layer: its window), and the head is the pooler's
dense layer and the classifier on one row per pair.
"""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from engine.models import ModelConfig


class Cost(NamedTuple):
    """FLOP coefficients of one model."""

    params: int  # non-embedding matmul parameters
    per_token: int  # 2 * params
    per_key: int  # attention FLOPs per (token, key seen) pair, all layers
    per_row: int  # LM head FLOPs per score row

    @classmethod
    def of(cls, cfg: ModelConfig) -> "Cost":
        e, d = cfg.hidden_size, cfg.head_dim
        attn = e * cfg.num_heads * d * 2 + e * cfg.num_kv_heads * d * 2  # wq, wo; wk, wv
        mlp = (3 if cfg.gated_mlp else 2) * e * cfg.intermediate_size  # BERT's: up, down
        params = cfg.num_layers * (attn + mlp)
        return cls(
            params, 2 * params, 4 * d * cfg.num_heads * cfg.num_layers, 2 * e * cfg.vocab_size
        )

    def chunk(self, prefix: int, suffixes: Sequence[int], rows: int | None = None) -> float:
        """FLOPs of a `prefix` computed once, then suffixes of the given lengths that each see it.

        `rows` score rows (default: one per suffix). A lone sequence of n tokens is
        `chunk(0, [n])`.
        """
        tokens = prefix + sum(suffixes)
        keys = prefix * (prefix + 1) // 2  # causal prefix: token i sees i + 1 keys
        keys += sum(s * prefix + s * (s + 1) // 2 for s in suffixes)
        rows = len(suffixes) if rows is None else rows
        return float(self.per_token * tokens + self.per_key * keys + self.per_row * rows)

    def sequences(self, seqs: Sequence[Sequence[int]]) -> float:
        """FLOPs of scoring each sequence alone (nothing shared)."""
        return sum(self.chunk(0, [len(s)]) for s in seqs)


def encoder_flops(cfg: ModelConfig, lengths: Sequence[int]) -> float:
    """FLOPs of a cross-encoder scoring pairs of `lengths` tokens, each alone: 2 x params per
    token, attention 4 x hidden per (token, key) per layer with every token seeing its whole
    pair (in a local layer the keys within `sliding_window // 2` on either side), and the head
    (pooler dense E x E, classifier E x labels) on one row per pair."""
    cost = Cost.of(cfg)
    per_key = cost.per_key // cfg.num_layers  # one layer's
    local = sum(cfg.sliding_layers) if cfg.window else 0
    head = 2 * cfg.hidden_size * (cfg.hidden_size + cfg.num_labels)
    total = 0
    for n in lengths:
        keys = (cfg.num_layers - local) * n * n + local * window_keys(n, cfg.sliding_window // 2)
        total += cost.per_token * n + per_key * keys + head
    return float(total)


def mlm_head_flops(cfg: ModelConfig, tokens: int) -> float:
    """FLOPs of a SPLADE model's masked-language-model head over `tokens` tokens: its dense
    E x E layer and its E x V vocabulary rows, every token (a quarter of BERT-base's work)."""
    e = cfg.hidden_size
    return 2.0 * tokens * e * (e + cfg.vocab_size)


def window_keys(n: int, half: int) -> int:
    """(token, key) pairs of `n` tokens that each see the keys within `half` on either side."""
    i = np.arange(n)
    return int((np.minimum(i + half, n - 1) - np.maximum(i - half, 0) + 1).sum())


def common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """Tokens all `seqs` share at the start, leaving each at least one token of its own."""
    if len(seqs) < 2:
        return 0
    first, n = seqs[0], min(map(len, seqs)) - 1
    for s in seqs[1:]:
        i = 0
        while i < n and s[i] == first[i]:
            i += 1
        n = i
    return n


def shared_prefix_flops(cost: Cost, seqs: Sequence[Sequence[int]]) -> tuple[float, int]:
    """(FLOPs, real tokens) of `seqs` with their common prefix computed once."""
    p = common_prefix(seqs)
    suffixes = [len(s) - p for s in seqs]
    return cost.chunk(p, suffixes), p + sum(suffixes)


def plan_flops(cost: Cost, plan: Sequence[Sequence], seqs: Sequence[Sequence[int]]) -> float:
    """FLOPs of an engine batch plan: batches of `(prefix_len, members)` chunks."""
    return sum(
        cost.chunk(c.prefix_len, [len(seqs[m]) - c.prefix_len for m in c.members])
        for batch in plan
        for c in batch
    )


def mfu(flops: float, seconds: float, peak_gflops: float) -> float:
    """Model FLOP utilisation: achieved FLOP/s over the peak."""
    return flops / seconds / (peak_gflops * 1e9)
