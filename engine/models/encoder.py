"""The encoder stack shared by the cross-encoder and embedder families (BERT, XLM-RoBERTa,
ModernBERT): each packed sequence (a cross-encoder's query/document pair, an embedder's text)
sees itself whole and nothing else (own spans that end where the sequence ends,
`score_kernels.metadata`); a classifier reads each pair's first token or its mean at the score rows
(`pair_logits`), an embedder pools each text into one vector (`pooled`).

Activations, LayerNorms and biases stay in f32; matmuls go through the `Dense` strategy with f32
accumulation, as in the decoder. What differs between families is in `ModelConfig`: learned
absolute positions with a token-type table and LayerNorm after each residual add (BERT,
XLM-RoBERTa), or RoPE with pre-norm blocks, a gated MLP and alternating local layers
(ModernBERT). Weights a family lacks (ModernBERT's biases) are zeros, so one path serves all.

Host parameters, beyond the decoder's layout (`engine.models.config`), `[in, out]` matrices:

    embed [V, E]    positions [P, E] (position_table)    token_types [Tt, E] (type_vocab_size)
    embed_norm, embed_norm_b [E]     final_norm, final_norm_b [E] (pre-norm models)
    layers: attn_norm(_b), mlp_norm(_b) [N, E]; wq, wk, wv, wo, bq, bk, bv, bo;
            w_up [N, E, I], b_up [N, I], w_gate, b_gate (gated_mlp); w_down [N, I, E], b_down
    pool_dense [E, E], pool_dense_b [E], pool_norm(_b) [E] ("gelu_norm")
    classifier [num_labels, E], classifier_b [num_labels]
    a SPLADE model's masked-language-model head (`splade`): mlm_dense [E, E], mlm_dense_b [E],
    mlm_norm(_b) [E], mlm_decoder [V, E] (the embedding table where tied), mlm_decoder_b [V]
    BGE-M3's heads (`m3`): m3_colbert [E, D], m3_colbert_b [D], m3_sparse [E], m3_sparse_b []
    a ColBERT model's projection (`colbert`): colbert_proj [E, D], colbert_proj_b [D]
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from engine.models import config
from engine.models.config import ModelConfig
from engine.models.decoder import (
    Dense,
    PackedInputs,
    Rope,
    pick_sliding,
    project_qkv,
    rope_frequencies,
    run_layers,
    split_last,
)
from engine.models.rows import over_score_rows
from score_kernels import activations

HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
HF_ACTIVATIONS |= {"relu": "relu", "silu": "silu"}


def config_from_hf(hf: dict, *, family: str, **flags) -> ModelConfig:
    """An encoder's ModelConfig from the fields encoder configs share (`num_labels` 0 without
    a sequence-classification head: the loader then needs an embedder's pooling); ValueError
    for an unknown activation."""
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu"
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"unsupported hidden activation {act!r} for {family}")
    eps = float(hf.get("layer_norm_eps", hf.get("norm_eps", 1e-12)))
    return config.config_from_hf(
        {"max_position_embeddings": 512, **hf},
        family=family,
        default_theta=0.0,
        norm_eps=eps,
        tie_word_embeddings=False,
        mlp_activation=HF_ACTIVATIONS[act],
        mlm_activation=HF_ACTIVATIONS[act],
        encoder=True,
        **flags,
    )


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * weight + bias


def _norm(x: jax.Array, p: dict, name: str, cfg: ModelConfig) -> jax.Array:
    return layer_norm(x, p[name], p[name + "_b"], cfg.norm_eps)


class Step(NamedTuple):
    """What one layer reads besides the residual stream (see `decoder.Step`)."""

    cfg: ModelConfig
    attention: Callable
    dense: Dense
    meta: Any  # score_kernels.AttentionMeta of the whole pairs
    window_meta: Any  # the local layers' (None: no layer is local)
    rope: Rope | None  # None: learned positions
    local_rope: Rope | None  # local layers' own RoPE (None: as global ones)
    dtype: Any
    matrices: dict  # "qkv", "o", "up", "down": prepared stacks over layers
    real_rows: jax.Array | None  # i32[]: the real rows of the layer's inputs (None: all)


def _attend(x: jax.Array, xs: tuple, s: Step) -> jax.Array:  # [T, H, D]
    """A layer's attention over every token of the residual x f32[T, E]."""
    index, sliding, normed, p = xs  # normed: this layer norms its attention input (pre-norm)
    cfg = s.cfg
    h = x
    if not cfg.post_norm:
        h = jnp.where(normed, _norm(x, p, "attn_norm", cfg), x)  # ModernBERT's first: identity
    rope = s.rope
    if rope is not None and s.local_rope is not None:
        rope = pick_sliding(sliding, s.local_rope, s.rope)
    q, k, v = project_qkv(h, s.matrices["qkv"], index, p, cfg, s.dense, s.real_rows, rope)
    meta = s.meta if s.window_meta is None else pick_sliding(sliding, s.window_meta, s.meta)
    dt = s.dtype
    return s.attention(q.astype(dt), k.astype(dt), v.astype(dt), meta, scale=cfg.attention_scale)


def _finish(x: jax.Array, o: jax.Array, xs: tuple, s: Step) -> jax.Array:
    """The rest of a layer at some rows: their residual f32[R, E] and attention [R, H, D] to
    the layer's output f32[R, E] (projection, MLP, norms)."""
    index, _, _, p = xs
    cfg, m, rows = s.cfg, s.matrices, s.real_rows
    x = s.dense.residual(o.reshape(x.shape[0], -1), m["o"], index, x, p["bo"], rows)
    if cfg.post_norm:
        x = _norm(x, p, "attn_norm", cfg)
    h = x if cfg.post_norm else _norm(x, p, "mlp_norm", cfg)
    x = s.dense.residual(_mlp_hidden(h, index, p, s), m["down"], index, x, p["b_down"], rows)
    return _norm(x, p, "mlp_norm", cfg) if cfg.post_norm else x


def _layer(x: jax.Array, xs: tuple, s: Step):
    return _finish(x, _attend(x, xs, s), xs, s), None


def _mlp_hidden(h: jax.Array, index: jax.Array, p: dict, s: Step) -> jax.Array:  # [T, I]
    """The down projection's input: act(h @ up + b_up) (bf16 where the dense strategy fuses
    it), or the gated act(h @ gate + b_gate) * (h @ up + b_up) in f32."""
    act, up = s.cfg.mlp_activation, s.matrices["up"]
    if not s.cfg.gated_mlp:
        return s.dense.activated(h, up, index, p["b_up"], act, s.real_rows)
    y = s.dense.matmul(h, up, index, s.real_rows)
    y = y.reshape(h.shape[0], -1, 2)  # [T, I, gate/up]
    return activations.apply(act, y[..., 0] + p["b_gate"]) * (y[..., 1] + p["b_up"])


def embed(params: dict, inputs: PackedInputs, cfg: ModelConfig) -> jax.Array:  # f32[T, E]
    """Word (+ token-type, + position) embeddings, normed. Token ids come coded as
    `type * vocab_size + id` when the model has several token types (`engine.host.pairs`)."""
    tokens = inputs.tokens
    coded = cfg.type_vocab_size > 1  # one type (XLM-RoBERTa): its row is added to every token
    ids = tokens % cfg.vocab_size if coded else tokens
    x = params["embed"][ids].astype(jnp.float32)
    if cfg.type_vocab_size:
        types = tokens // cfg.vocab_size if coded else jnp.zeros_like(tokens)
        x = x + params["token_types"][types].astype(jnp.float32)
    if cfg.position_table:
        x = x + params["positions"][_position_rows(ids, inputs, cfg)].astype(jnp.float32)
    return layer_norm(x, params["embed_norm"], params["embed_norm_b"], cfg.norm_eps)


def _position_rows(ids: jax.Array, inputs: PackedInputs, cfg: ModelConfig) -> jax.Array:
    """Each token's row of the position table (i32[T]). With an offset (XLM-RoBERTa's
    `pad_token_id + 1`), as transformers counts them from the ids: a padding id in the text
    reads the padding row and is not counted in the positions of the tokens after it."""
    if not cfg.position_offset:
        return inputs.positions
    pad = ids == cfg.position_offset - 1  # bool[T]
    before = jnp.cumsum(pad) - pad  # padding ids before each token, over the whole batch
    start = inputs.meta.own_start  # i32[T]: where each token's sequence starts
    counted = inputs.positions - (before - before[start])  # the sequence's own pads left out
    return jnp.where(pad, cfg.position_offset - 1, counted + cfg.position_offset)


def forward(
    params: dict,
    inputs: PackedInputs,
    pool=None,
    *,
    cfg: ModelConfig,
    family=None,
    attention: Callable,
    dense: Dense,
    output: Callable,
    write_kv: Callable | None = None,
    unroll: bool = False,
) -> tuple[jax.Array, None]:
    """What `output` makes of the encoded tokens at each score row, f32[S, L], and no pool
    (encoders keep none): `pair_logits` or `pooled`, called as `output(x f32[T, E], inputs,
    params, cfg, dense)` with `HEAD_ROWS` of the score rows at a time (`engine.models.rows`;
    under CLS pooling x holds those rows' states alone), or `states` (every token's, f32[T, E]).
    The signature is `decoder.forward`'s, so a device program runs either."""
    if pool is not None:
        raise ValueError("an encoder keeps no KV cache")
    x = embed(params, inputs, cfg)
    rope = local = None
    if not cfg.position_table:
        inv = rope_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        rope = Rope.at(inputs.positions, inv)
        if cfg.local_rope_theta:
            local_inv = rope_frequencies(cfg.head_dim, cfg.local_rope_theta, None)
            local = Rope.at(inputs.positions, local_inv)
    window_meta = inputs.window_meta if cfg.window else None
    if cfg.window and window_meta is None:
        raise ValueError("this model has local attention layers: the batch needs window_meta")
    m = params["matrices"]
    dtype = params["embed"].dtype
    step = Step(
        cfg, attention, dense, inputs.meta, window_meta, rope, local, dtype, m, inputs.token_count
    )
    n = cfg.num_layers
    sliding = jnp.asarray(cfg.sliding_layers or (False,) * n)
    normed = jnp.ones(n, bool) if cfg.first_block_norm else jnp.arange(n) > 0  # ModernBERT's
    xs = (jnp.arange(n, dtype=jnp.int32), sliding, normed, params["layers"])
    layer = lambda x, xs: _layer(x, xs, step)

    def final(x: jax.Array) -> jax.Array:  # a pre-norm stack's final norm
        if cfg.post_norm:
            return x
        return layer_norm(x, params["final_norm"], params["final_norm_b"], cfg.norm_eps)

    if not _reads_first_tokens(output, cfg):  # the output reads every token's final state
        x = final(run_layers(layer, x, xs, unroll))
        if output in (states, splade, m3, colbert):  # of the whole batch at once
            return output(x, inputs, params, cfg, dense), None
        at_rows = lambda rows, labels: output(x, _at(inputs, rows, labels), params, cfg, dense)
        return over_score_rows(at_rows, inputs), None
    stack, last = split_last(xs)
    x = run_layers(layer, x, stack, unroll)
    o = _attend(x, last, step)

    at_score_rows = step._replace(real_rows=None)  # x[rows] holds score rows, all read

    def at_first_tokens(rows: jax.Array, labels: jax.Array) -> jax.Array:  # i32[C], i32[C, L]
        h = final(_finish(x[rows], o[rows], last, at_score_rows))  # f32[C, E]: those rows
        own = jnp.arange(rows.shape[0], dtype=rows.dtype)
        return output(h, _at(inputs, own, labels), params, cfg, dense)

    return over_score_rows(at_first_tokens, inputs), None


def _at(inputs: PackedInputs, rows: jax.Array, labels: jax.Array) -> PackedInputs:
    """`inputs` with score rows `rows` and their `labels` alone (a step of the output)."""
    return inputs._replace(score_rows=rows, label_ids=labels)


def _reads_first_tokens(output: Callable, cfg: ModelConfig) -> bool:
    """Whether `output` reads the final states at the score rows alone: each sequence's first
    token (CLS pooling), not its mean or max or every token."""
    embedding = cfg.embedding.mode if cfg.embedding else None
    return {pair_logits: cfg.pooling, pooled: embedding}.get(output) == "cls"


def states(x: jax.Array, inputs: PackedInputs, params: dict, cfg: ModelConfig, dense: Dense):
    """f32[T, E]: every token's final state (an embedder's token vectors, before pooling)."""
    return x


# tokens per step of a SPLADE head: their f32[C, V] logits stay small where the whole batch's
# would be f32[T, V] (480 MB for 4,096 tokens of a 30k vocabulary)
SPLADE_TOKENS = 256


def splade(x: jax.Array, inputs: PackedInputs, params: dict, cfg: ModelConfig, dense: Dense):
    """f32[S, V]: each score row's text's SPLADE vector, its tokens' log-saturated MLM logits
    (`cfg.splade.activation`) pooled by their max or sum (`cfg.splade.pooling`), from x
    f32[T, E] every token's final state. The MLM head runs over `SPLADE_TOKENS` tokens a step,
    as many steps as the real tokens fill; each step's logits are folded into their texts'
    rows at once. The activation is monotone, so a max pool keeps the raw logits' maximum and
    saturates once per text: the bias and the two logarithms run on f32[S, V], not f32[T, V]."""
    t, c, v = x.shape[0], SPLADE_TOKENS, cfg.vocab_size
    span, at, count = _token_spans(t, inputs)  # padding tokens: span count - 1, dropped
    n = -(-t // c)
    x = jnp.pad(x, ((0, n * c - t), (0, 0)))
    span = jnp.pad(span, (0, n * c - t), constant_values=count - 1)
    most = cfg.splade.pooling == "max"

    def step(i, pooled):  # f32[count, V]
        h = jax.lax.dynamic_slice_in_dim(x, i * c, c)
        rows = jax.lax.dynamic_slice_in_dim(span, i * c, c)
        if most:
            return pooled.at[rows].max(_mlm_logits(h, params, cfg, dense))
        logits = _mlm_logits(h, params, cfg, dense) + params["mlm_decoder_b"]
        return pooled.at[rows].add(_log_saturated(logits, cfg))

    steps = (jnp.asarray(inputs.token_count, jnp.int32) + c - 1) // c
    start = jnp.full((count, v), -jnp.inf if most else 0.0, jnp.float32)
    pooled = jax.lax.fori_loop(0, steps, step, start)[at]
    return _log_saturated(pooled + params["mlm_decoder_b"], cfg) if most else pooled


def m3(x: jax.Array, inputs: PackedInputs, params: dict, cfg: ModelConfig, dense: Dense):
    """BGE-M3's three outputs of one forward, from x f32[T, E] every token's final state: each
    score row's first token's state f32[S, E] (the dense vector, before normalisation), each
    token's lexical weight relu(x . w + b) f32[T], and each token's multi-vector, the colbert
    projection normalised (as torch's `normalize`, norms at least 1e-12) f32[T, D]."""
    weights = jnp.maximum(x @ params["m3_sparse"] + params["m3_sparse_b"], 0.0)
    vectors = _multi_vectors(x, params["m3_colbert"], params["m3_colbert_b"], dense)
    return x[inputs.score_rows], weights, vectors


def colbert(x: jax.Array, inputs: PackedInputs, params: dict, cfg: ModelConfig, dense: Dense):
    """f32[T, D]: a ColBERT model's multi-vector of every token, from x f32[T, E] every token's
    final state: its projection, normalised."""
    return _multi_vectors(x, params["colbert_proj"], params["colbert_proj_b"], dense)


def _multi_vectors(x: jax.Array, weight, bias: jax.Array, dense: Dense) -> jax.Array:
    """f32[T, D]: x f32[T, E] projected (weight prepared by `dense`, bias f32[D]) and divided
    by its norms (at least 1e-12, as torch's `normalize`)."""
    vectors = dense.matmul(x, weight, jnp.int32(0)) + bias
    norms = jnp.sqrt(jnp.sum(jnp.square(vectors), axis=-1, keepdims=True))
    return vectors / jnp.maximum(norms, 1e-12)


def _mlm_logits(h: jax.Array, params: dict, cfg: ModelConfig, dense: Dense) -> jax.Array:
    """f32[C, V]: the masked-language-model head's logits of token states h f32[C, E], less
    the decoder's bias: dense, activation, LayerNorm, then the vocabulary's rows."""
    h = dense.matmul(h, params["mlm_dense"], jnp.int32(0)) + params["mlm_dense_b"]
    h = activations.apply(cfg.mlm_activation, h)
    h = layer_norm(h, params["mlm_norm"], params["mlm_norm_b"], cfg.norm_eps)
    return dense.head(h, params["mlm_decoder"])


def _log_saturated(logits: jax.Array, cfg: ModelConfig) -> jax.Array:
    """log(1 + relu(x)), and for the "log1p_relu" activation log(1 + that)."""
    w = jnp.log1p(jnp.maximum(logits, 0.0))
    return jnp.log1p(w) if cfg.splade.activation == "log1p_relu" else w


def pair_logits(x: jax.Array, inputs: PackedInputs, params: dict, cfg: ModelConfig, dense: Dense):
    """f32[S, L]: the classifier's logits of `label_ids` (label indices) for each score row's
    pair, read from its first token or its mean (`cfg.pooling`)."""
    pooled = _pool(x, inputs, cfg.pooling)  # [S, E]
    logits = _classify(pooled, params, cfg, dense)  # [S, num_labels]
    return jnp.take_along_axis(logits, inputs.label_ids, axis=1)


def pooled(x: jax.Array, inputs: PackedInputs, params: dict, cfg: ModelConfig, dense: Dense):
    """f32[S, E]: an embedder's vector of each score row's sequence, its first token, the
    mean of its tokens or their elementwise max (`cfg.embedding.mode`), before any
    normalisation."""
    return _pool(x, inputs, cfg.embedding.mode)


def _pool(x: jax.Array, inputs: PackedInputs, mode: str) -> jax.Array:  # f32[S, E]
    """The first token of each score row's sequence ("cls"), the mean of its tokens, or their
    max: the sequence is the row's own span in the unwindowed metadata (encoders have no
    context region)."""
    if mode == "cls":
        return x[inputs.score_rows]
    span, at, count = _token_spans(x.shape[0], inputs)
    if mode == "max":
        return jax.ops.segment_max(x, span, num_segments=count)[at]
    sums = jax.ops.segment_sum(x, span, num_segments=count)[at]  # f32[S, E], in token order
    lengths = inputs.meta.own_end[inputs.score_rows] - inputs.meta.own_start[inputs.score_rows]
    return sums / lengths[:, None].astype(jnp.float32)


def _token_spans(tokens: int, inputs: PackedInputs) -> tuple[jax.Array, jax.Array, int]:
    """Each token's span among the score rows' sequences (i32[T]; padding and sequences of no
    score row: the extra last span), each score row's span (i32[S]), and the span count. A
    segment sum or max over the spans costs T x E, where a [S, T] weight matrix cost S times
    that. Spans are keyed by their start's first place among the sorted starts, as padding rows
    repeat a sequence's."""
    start = inputs.meta.own_start[inputs.score_rows]  # i32[S]
    order = jnp.argsort(start)
    starts, ends = start[order], inputs.meta.own_end[inputs.score_rows][order]  # sorted
    token = jnp.arange(tokens)  # i32[T]
    at = jnp.clip(jnp.searchsorted(starts, token, side="right") - 1, 0)  # i32[T]
    span = jnp.searchsorted(starts, starts[at], side="left")
    s = start.shape[0]
    span = jnp.where((token >= starts[at]) & (token < ends[at]), span, s)  # s: no sequence's
    return span, jnp.searchsorted(starts, start, side="left"), s + 1


def _classify(pooled: jax.Array, params: dict, cfg: ModelConfig, dense: Dense) -> jax.Array:
    h = dense.matmul(pooled, params["pool_dense"], jnp.int32(0)) + params["pool_dense_b"]
    if cfg.pooler == "tanh":
        h = jnp.tanh(h)
    else:
        h = activations.apply("gelu", h)
        h = layer_norm(h, params["pool_norm"], params["pool_norm_b"], cfg.norm_eps)
    return dense.head(h, params["head"]) + params["classifier_b"]
