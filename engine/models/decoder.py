"""The decoder stack shared by every family: embeddings, RoPE, layers under `lax.scan`, and the
label head that runs on score rows only.

Activations (the residual stream, norms, RoPE, softmax) stay in f32; matmul inputs are cast to
the weights' dtype and accumulate in f32 (`preferred_element_type`), which on CPU is both the
fast and the accurate path for bf16.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from engine.models.config import ModelConfig
from kernels.metadata import AttentionMeta

Params = dict


class Family(NamedTuple):
    """What differs between model families: config parsing and the q/k/v projection."""

    name: str
    config_from_hf: Callable[[dict], ModelConfig]
    project_qkv: Callable[..., tuple[jax.Array, jax.Array, jax.Array]]


class PackedInputs(NamedTuple):
    """Device inputs of one packed prefix batch (see `engine.packing`)."""

    tokens: jax.Array  # i32[T]
    positions: jax.Array  # i32[T]
    meta: AttentionMeta
    score_rows: jax.Array  # i32[S]
    label_ids: jax.Array  # i32[S, L]


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """`x @ w` with inputs in the weight dtype and f32 accumulation."""
    return jnp.matmul(x.astype(w.dtype), w, preferred_element_type=jnp.float32)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def split_heads(x: jax.Array, heads: int) -> jax.Array:
    return x.reshape(x.shape[0], heads, -1)  # [T, heads, D]


def rope_frequencies(cfg: ModelConfig) -> jax.Array:
    """Inverse frequencies f32[D/2], with Llama-3 scaling when the config asks for it."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    s = cfg.rope_scaling
    if s is None:
        return inv
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


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half RoPE on x f32[T, heads, D] with cos/sin f32[T, 1, D/2]."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _layer(x, p, *, cfg: ModelConfig, family: Family, attention, meta, cos, sin):
    t = x.shape[0]
    q, k, v = family.project_qkv(rms_norm(x, p["attn_norm"], cfg.rms_norm_eps), p, cfg)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    dt = p["wo"].dtype
    o = attention(q.astype(dt), k.astype(dt), v.astype(dt), meta, scale=cfg.head_dim**-0.5)
    x = x + matmul(o.reshape(t, -1), p["wo"])
    h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
    x = x + matmul(jax.nn.silu(matmul(h, p["w_gate"])) * matmul(h, p["w_up"]), p["w_down"])
    return x, None


def label_logprobs(
    params: Params, inputs: PackedInputs, *, cfg: ModelConfig, family: Family, attention
) -> jax.Array:
    """Full-vocabulary log-probs f32[S, L] of `label_ids` at each score row."""
    x = params["embed"][inputs.tokens].astype(jnp.float32)  # [T, E]
    angles = inputs.positions.astype(jnp.float32)[:, None] * rope_frequencies(cfg)  # [T, D/2]
    cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]
    layer = lambda x, p: _layer(
        x, p, cfg=cfg, family=family, attention=attention, meta=inputs.meta, cos=cos, sin=sin
    )
    x, _ = jax.lax.scan(layer, x, params["layers"])
    h = rms_norm(x[inputs.score_rows], params["final_norm"], cfg.rms_norm_eps)  # [S, E]
    head = params.get("lm_head", params["embed"])  # [V, E]
    logits = jnp.matmul(h.astype(head.dtype), head.T, preferred_element_type=jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)  # [S, V]
    return jnp.take_along_axis(logp, inputs.label_ids, axis=1)
