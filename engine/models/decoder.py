"""The decoder stack shared by every family: embeddings, RoPE, layers under `lax.scan`, and the
label head that runs on score rows only.

Activations (the residual stream, norms, RoPE, softmax) stay in f32; matmul inputs are cast to
the weights' dtype and accumulate in f32 (`preferred_element_type`), which on CPU is both the
fast and the accurate path for bf16. How matrices are stored and multiplied is the `Dense`
strategy the forward is given, as attention is: one code path for every strategy.
"""

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from engine.models.config import ModelConfig, RopeScaling
from engine.models.layout import adds_residual, fused_qkv
from engine.models.rows import over_score_rows
from score_kernels.dense import split_qkv
from score_kernels.rope import rotate
from score_kernels.softcap import soft_cap

Params = dict


class Family(NamedTuple):
    """What differs between model families: config parsing, and the traits of their configs (the
    q/k/v projection's differences are `ModelConfig` flags: `qkv_bias`, `qk_norm`)."""

    name: str
    config_from_hf: Callable[[dict], ModelConfig]
    # what a config of this family has that its files need not say: `default_theta` (the RoPE
    # base when none is given) and `ModelConfig` flags; the GGUF loader reads them too
    traits: Mapping[str, Any] = MappingProxyType({})


class PackedInputs(NamedTuple):
    """Device inputs of one packed prefix batch (see `engine.host.packing`)."""

    tokens: jax.Array  # i32[T]
    positions: jax.Array  # i32[T]
    meta: Any  # score_kernels.AttentionMeta: built by the packer, read only by attention
    score_rows: jax.Array  # i32[S]
    label_ids: jax.Array  # i32[S, L]
    row_count: jax.Array  # i32[]: the score rows computed, the first ones (the rest pad)
    token_count: jax.Array  # i32[]: the real tokens, the first ones (the rest pad)
    cache_slots: jax.Array  # i32[T]: KV pool slot each token's K/V goes to; -1: none
    # the sliding-window layers' metadata (`ModelConfig.window`); None when no layer slides
    window_meta: Any = None


class KVPool(Protocol):
    """The paged KV pool the forward is given (`score_kernels.paging.LayerPool`): opaque here but
    for choosing the layer its pages are read and written at."""

    def at_layer(self, layer: jax.Array) -> "KVPool": ...


class Dense(Protocol):
    """The dense matmul strategy the forward is given (`score_kernels.dense`): how each prepared
    weight multiplies. `layer` picks one matrix of a stack prepared over layers; `rows` (i32[]
    or None: all) counts x's real rows, the first ones: the rest are padding, whose results
    nothing reads (a strategy may skip them)."""

    def matmul(self, x: jax.Array, w, layer: jax.Array, rows=None) -> jax.Array: ...  # f32[M, N]

    def gated(  # act(x @ gate) * (x @ up)
        self, x: jax.Array, w, layer: jax.Array, rows=None, activation: str = "silu"
    ) -> jax.Array: ...

    def activated(  # act(x @ w + bias) [M, N], f32 or bf16
        self, x: jax.Array, w, layer: jax.Array, bias: jax.Array, activation: str, rows=None
    ) -> jax.Array: ...

    def qkv(  # q [M, H, D], k and v [M, Hkv, D] of x @ w + bias, q and k rotated: f32 or bf16
        self,
        x: jax.Array,
        w,
        layer: jax.Array,
        bias: jax.Array,
        heads: int,
        kv_heads: int,
        rows=None,
        rope=None,
    ) -> tuple[jax.Array, jax.Array, jax.Array]: ...

    def residual(  # f32[M, N]: residual + x @ w (+ bias)
        self, x: jax.Array, w, layer: jax.Array, residual: jax.Array, bias=None, rows=None
    ) -> jax.Array: ...

    def head(self, h: jax.Array, w) -> jax.Array: ...  # f32[S, V]


def project_qkv(
    h: jax.Array, w, index: jax.Array, p: Params, cfg: ModelConfig, dense: Dense, rows, rope
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q [T, H, D], k and v [T, Hkv, D] of the normed residual h f32[T, E] through the fused
    q/k/v stack `w` (`engine.models.layout`): the product with its bias, q and k rotated by
    `rope` (a `Rope`; None: learned positions), in one `Dense.qkv` call (bf16 where the strategy
    fuses it, else f32); with per-head norms before RoPE (`cfg.qk_norm`: Qwen3, Gemma 3), in
    f32 with the norms between."""
    heads, kv_heads = cfg.num_heads, cfg.num_kv_heads
    if fused_qkv(cfg):
        return dense.qkv(h, w, index, p["b_qkv"], heads, kv_heads, rows, rope)
    q, k, v = split_qkv(dense.matmul(h, w, index, rows), heads, kv_heads)
    q, k = rms_norm(q, p["q_norm"], cfg.norm_eps), rms_norm(k, p["k_norm"], cfg.norm_eps)
    return rotate(q, *rope), rotate(k, *rope), v


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope_frequencies(head_dim: int, theta: float, s: RopeScaling | None) -> jax.Array:
    """Inverse frequencies f32[D/2], scaled as `s` says (Llama 3's band, or linear)."""
    d = head_dim
    inv = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    if s is None:
        return inv
    if s.rope_type == "linear":
        return inv / s.factor
    wavelen = 2 * math.pi / inv
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    mid = (1 - smooth) * inv / s.factor + smooth * inv
    scaled = jnp.where(wavelen > low_wavelen, inv / s.factor, inv)
    is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(is_mid, mid, scaled)


class Rope(NamedTuple):
    """Each token's RoPE angles' cosines and sines (`score_kernels.rope.rotate`)."""

    cos: jax.Array  # f32[T, D/2]
    sin: jax.Array  # f32[T, D/2]

    @classmethod
    def at(cls, positions: jax.Array, inv_freq: jax.Array) -> "Rope":
        angles = positions.astype(jnp.float32)[:, None] * inv_freq  # [T, D/2]
        return cls(jnp.cos(angles), jnp.sin(angles))


class Step(NamedTuple):
    """What one layer reads besides the residual stream: the batch, RoPE, the strategies and
    the weights (`vectors` sliced to this layer by the scan, `matrices` whole stacks). Sliding-
    window layers read `window_meta` and `local_rope` in place of `meta` and `rope`."""

    cfg: ModelConfig
    family: Family
    attention: Callable
    dense: Dense
    meta: Any  # the attention metadata (score_kernels.AttentionMeta), passed through unread
    window_meta: Any  # the same for sliding-window layers; None when none slides
    rope: Rope
    local_rope: Rope | None  # sliding layers' own RoPE; None: theirs is `rope`
    dtype: Any  # the weights' dtype: attention inputs are cast to it
    matrices: Params  # "qkv", "o", "gate_up", "down": prepared stacks over layers
    cache_slots: jax.Array  # i32[T]
    write_kv: Callable  # (pool, slots, k, v) -> pool: `score_kernels.paging.write`
    real_rows: jax.Array | None  # i32[]: the real rows of the layer's inputs (None: all)


def _attend(carry: tuple[jax.Array, KVPool | None], xs: tuple[jax.Array, ...], s: Step):
    """A layer up to its attention's output: the residual f32[T, E], the attention [T, H, D] and
    the pool with this layer's K/V written."""
    x, pool = carry
    index, sliding, p = xs  # the layer index i32[], whether it slides bool[], norms and biases
    cfg, m = s.cfg, s.matrices
    h = rms_norm(x, p["attn_norm"], cfg.norm_eps)
    rope = s.rope if s.local_rope is None else pick_sliding(sliding, s.local_rope, s.rope)
    q, k, v = project_qkv(h, m["qkv"], index, p, cfg, s.dense, s.real_rows, rope)
    dt = s.dtype
    k, v = k.astype(dt), v.astype(dt)
    if pool is not None:  # written first: later tokens of this batch may read them from pages
        pool = s.write_kv(pool.at_layer(index), s.cache_slots, k, v)
    meta = s.meta if s.window_meta is None else pick_sliding(sliding, s.window_meta, s.meta)
    scale, cap = cfg.attention_scale, cfg.attn_softcap
    o = s.attention(q.astype(dt), k, v, meta, scale=scale, softcap=cap, pool=pool)
    return x, o, pool


def _finish(x: jax.Array, o: jax.Array, xs: tuple[jax.Array, ...], s: Step) -> jax.Array:
    """The rest of a layer at some rows: their residual f32[R, E] and attention [R, H, D] to
    the layer's output f32[R, E] (projection, MLP)."""
    index, _, p = xs
    m = s.matrices
    x = _residual(x, o.reshape(x.shape[0], -1), m["o"], index, p, "post_attn_norm", s)
    h = rms_norm(x, p["mlp_norm"], s.cfg.norm_eps)
    return _residual(
        x, _mlp_gate(h, m["gate_up"], index, s), m["down"], index, p, "post_mlp_norm", s
    )


def _layer(carry: tuple[jax.Array, KVPool | None], xs: tuple[jax.Array, ...], s: Step):
    x, o, pool = _attend(carry, xs, s)
    return (_finish(x, o, xs, s), pool), None


def run_layers(layer: Callable, carry, xs: tuple, unroll: bool):
    """`layer(carry, xs_i) -> (carry, None)` over the stacked layers `xs` under `lax.scan`:
    the carry after the last."""
    return jax.lax.scan(layer, carry, xs, unroll=unroll)[0]


def split_last(xs: tuple) -> tuple[tuple, tuple]:
    """The stacked layers `xs` as all but the last (still stacked), and the last's slices. The
    forward runs the last layer past its attention at the score rows alone: the output reads
    no other row's final state, so the rest's projection and MLP would be waste (every
    token's K/V is still computed, and a decoder's written to the pool)."""
    return jax.tree.map(lambda a: a[:-1], xs), jax.tree.map(lambda a: a[-1], xs)


def pick_sliding(sliding: jax.Array, local, default):
    """`local` on a sliding-window layer, `default` elsewhere (pytrees of equal shapes)."""
    return jax.tree.map(lambda a, b: jnp.where(sliding, a, b), local, default)


def _residual(x: jax.Array, h: jax.Array, w, index: jax.Array, p: Params, norm: str, s: "Step"):
    """The residual x f32[T, E] plus a sublayer's output projection h @ w: added as the product
    is written (`Dense.residual`), or under `sandwich_norms` normed (`norm`) first."""
    if adds_residual(s.cfg):
        return s.dense.residual(h, w, index, x, None, s.real_rows)
    y = s.dense.matmul(h, w, index, s.real_rows)
    return x + rms_norm(y, p[norm], s.cfg.norm_eps)


def _mlp_gate(h: jax.Array, w, index: jax.Array, s: "Step") -> jax.Array:
    """act(h @ gate) * (h @ up) [T, I] (SwiGLU, GeGLU): the activation fused in the dense
    strategy's gated product where it has one (bf16 out), else after it in XLA (f32)."""
    return s.dense.gated(h, w, index, s.real_rows, s.cfg.mlp_activation)


def forward(
    params: Params,
    inputs: PackedInputs,
    pool: KVPool | None = None,
    *,
    cfg: ModelConfig,
    family: Family,
    attention: Callable,
    dense: Dense,
    output: Callable,
    write_kv: Callable | None = None,
    unroll: bool = False,
    rows: Callable | None = None,
) -> tuple[jax.Array, KVPool | None]:
    """What `output` makes of the final hidden state at each score row, f32[S, L], and the pool:
    `label_logprobs` (a language-model head), `class_logits` (a sequence-classification head)
    or `last_hidden` (an embedder's: L is E), each called as `output(h f32[R, E], label_ids
    i32[R, L], head, cfg, dense)` on `HEAD_ROWS` rows at a time (`engine.models.rows`). Under
    `last_hidden`, `rows(h f32[T, E], inputs)` may make the answer of every token's states
    instead (`mean_rows`: the mean of each row's sequence; `every_token`: a row per token,
    f32[T, E]).

    `params` is laid out as `engine.models.layout.place_decoder` makes it: "embed", "final_norm",
    "head" and "matrices" prepared by `dense`, "layers" the per-layer vectors. With a `pool`,
    every layer writes the batch's K/V at `inputs.cache_slots` (with `write_kv`) before its
    attention reads the context region from it; the pool returned holds those writes.
    """
    embed = params["embed"]
    if cfg.window and inputs.window_meta is None:
        raise ValueError("this model has sliding-window layers: the batch needs window_meta")
    x = embed[inputs.tokens].astype(jnp.float32)  # [T, E]
    if cfg.embed_scale:  # the scale in the embedding's dtype, as the reference rounds it
        x = x * jnp.asarray(cfg.hidden_size**0.5, embed.dtype).astype(jnp.float32)
    rope = Rope.at(
        inputs.positions, rope_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    )
    local = None
    if cfg.local_rope_theta:
        local = Rope.at(
            inputs.positions, rope_frequencies(cfg.head_dim, cfg.local_rope_theta, None)
        )
    step = Step(
        cfg,
        family,
        attention,
        dense,
        inputs.meta,
        inputs.window_meta if cfg.window else None,
        rope,
        local,
        embed.dtype,
        params["matrices"],
        inputs.cache_slots,
        write_kv,
        inputs.token_count,
    )
    indices = jnp.arange(cfg.num_layers, dtype=jnp.int32)
    sliding = jnp.asarray(cfg.sliding_layers or (False,) * cfg.num_layers)
    layer = lambda carry, xs: _layer(carry, xs, step)
    xs = (indices, sliding, params["layers"])
    final = lambda x: rms_norm(x, params["final_norm"], cfg.norm_eps)
    if rows is not None:  # the rows read every token's final state
        if output is not last_hidden:
            raise ValueError("rows of every token's states take the last_hidden output")
        x, pool = run_layers(layer, (x, pool), xs, unroll)
        return rows(final(x), inputs), pool
    stack, last = split_last(xs)
    x, o, pool = _attend(run_layers(layer, (x, pool), stack, unroll), last, step)

    at_score_rows = step._replace(real_rows=None)  # x[rows] holds score rows, all read

    def at_rows(rows: jax.Array, labels: jax.Array) -> jax.Array:  # i32[C], i32[C, L]
        h = final(_finish(x[rows], o[rows], last, at_score_rows))  # f32[C, E]
        return output(h, labels, params["head"], cfg, dense)

    return over_score_rows(at_rows, inputs), pool


def mean_rows(h: jax.Array, inputs: PackedInputs) -> jax.Array:  # f32[S, E]
    """The mean of the final states h f32[T, E] over each score row's sequence, its own span up
    to the row (a sequence packed alone: all of it)."""
    key = jnp.arange(h.shape[0])[None, :]

    def at_rows(rows: jax.Array, labels: jax.Array) -> jax.Array:  # f32[C, E]
        start = inputs.meta.own_start[rows][:, None]  # i32[C, 1]
        end = rows[:, None] + 1
        weights = ((key >= start) & (key < end)).astype(jnp.float32) / (end - start)  # [C, T]
        return jnp.matmul(weights, h, precision=jax.lax.Precision.HIGHEST)

    return over_score_rows(at_rows, inputs)


def every_token(h: jax.Array, inputs: PackedInputs) -> jax.Array:  # f32[T, E]
    """Every token's final state, a row per token (an embedder's token vectors)."""
    return h


def label_logprobs(h: jax.Array, labels: jax.Array, head, cfg: ModelConfig, dense: Dense):
    """f32[R, L]: the full-vocabulary log-probs of `labels` (i32[R, L]) at rows h f32[R, E].
    The label `V` (one past the vocabulary) reads the negated log-normaliser: a label's
    log-prob minus it is that label's logit."""
    logits = dense.head(h, head)  # [R, V]
    logits = soft_cap(logits, cfg.final_softcap)
    vocab = logits.shape[1]
    lse = jax.nn.logsumexp(logits, axis=1, keepdims=True)  # [R, 1]
    picked = jnp.take_along_axis(logits, jnp.minimum(labels, vocab - 1), axis=1) - lse
    return jnp.where(labels == vocab, -lse, picked)


def class_logits(h: jax.Array, labels: jax.Array, head, cfg: ModelConfig, dense: Dense):
    """f32[R, L]: a sequence-classification head's raw logits of `labels` (label indices,
    i32[R, L]) at rows h f32[R, E]."""
    logits = dense.head(h, head)  # [R, num_labels]
    return jnp.take_along_axis(logits, labels, axis=1)


def last_hidden(h: jax.Array, labels: jax.Array, head, cfg: ModelConfig, dense: Dense):
    """f32[R, E]: the final hidden state itself at rows h f32[R, E] (a last-token embedder's
    vector, before any normalisation); no head is read."""
    return h
