"""The decoder stack shared by every family: embeddings, RoPE, layers under `lax.scan`, and the
label head that runs on score rows only.

Activations (the residual stream, norms, RoPE, softmax) stay in f32; matmul inputs are cast to
the weights' dtype and accumulate in f32 (`preferred_element_type`), which on CPU is both the
fast and the accurate path for bf16. Layer matrices may come packed for the native CPU dense
kernel (`PackedStack`, see `pack_layers`); `matmul` takes either form.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from engine.models.config import ModelConfig
from kernels import cpu
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


# the layer matrices, each [L, K, N] in a checkpoint's params["layers"]
LAYER_MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


class PackedStack(NamedTuple):
    """A stack of layer matrices [L, K, N] packed for `kernels.cpu.dense_cpu`."""

    data: jax.Array  # bf16[L, N/16, K/2, 32]


class PackedLayer(NamedTuple):
    """One layer's matrix of a `PackedStack`: the whole stack and the layer index, so a scan
    over layers never copies the matrix out of the stack."""

    data: jax.Array  # bf16[L, N/16, K/2, 32]
    layer: jax.Array  # i32[]

    @property
    def dtype(self):
        return self.data.dtype


def pack_layers(params: Params) -> Params:
    """`params` with every bf16 layer matrix the native dense kernels take as a `PackedStack`:
    q, k and v side by side as "w_qkv" (one call), gate and up together as "w_gate_up"
    (`kernels.cpu.gated_cpu`), the others under their own names, and the LM head as
    "packed_head" (a tied head keeps "embed" for the lookup)."""
    layers = dict(params["layers"])
    qkv = [layers[n] for n in ("wq", "wk", "wv")]
    if all(map(_packable, qkv)):
        w_qkv = cpu.pack_dense(jnp.concatenate(qkv, axis=-1))
        layers["w_qkv"] = PackedStack(jnp.asarray(w_qkv))
        for name in ("wq", "wk", "wv"):
            layers.pop(name)
    if _packable(layers["w_gate"]) and _packable(layers["w_up"]):
        gate_up = cpu.pack_gated(layers.pop("w_gate"), layers.pop("w_up"))
        layers["w_gate_up"] = PackedStack(jnp.asarray(gate_up))
    for name in LAYER_MATRICES:
        w = layers.get(name)
        if _packable(w):
            layers[name] = PackedStack(jnp.asarray(cpu.pack_dense(w)))
    params = {**params, "layers": layers}
    head = params.get("lm_head", params["embed"]).T[None]  # [1, E, V]
    if _packable(head):
        params["packed_head"] = PackedStack(jnp.asarray(cpu.pack_dense(head)))
        params.pop("lm_head", None)
    return params


def _packable(w: jax.Array | None) -> bool:  # w: [L, K, N]
    return w is not None and w.dtype == jnp.bfloat16 and cpu.dense_supports(*w.shape[1:])


def matmul(x: jax.Array, w: jax.Array | PackedLayer) -> jax.Array:
    """`x @ w` with inputs in the weight dtype and f32 accumulation."""
    if isinstance(w, PackedLayer):
        return cpu.dense_cpu(x, w.data, w.layer)
    return jnp.matmul(x.astype(w.dtype), w, preferred_element_type=jnp.float32)


def project(h: jax.Array, p: Params, cfg: ModelConfig) -> tuple[jax.Array, ...]:
    """The q f32[T, H*D], k and v f32[T, Hkv*D] projections of h, from "w_qkv" when packed."""
    if "w_qkv" not in p:
        return matmul(h, p["wq"]), matmul(h, p["wk"]), matmul(h, p["wv"])
    qkv = matmul(h, p["w_qkv"])  # [T, (H + 2 Hkv) D]
    q_end = cfg.num_heads * cfg.head_dim
    k_end = q_end + cfg.num_kv_heads * cfg.head_dim
    return qkv[:, :q_end], qkv[:, q_end:k_end], qkv[:, k_end:]


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
    x = x + matmul(swiglu(h, p), p["w_down"])
    return x, None


def swiglu(h: jax.Array, p: Params) -> jax.Array:
    """silu(h @ w_gate) * (h @ w_up): [T, I], bf16 from the packed kernel, else f32."""
    if "w_gate_up" in p:
        return cpu.gated_cpu(h, p["w_gate_up"].data, p["w_gate_up"].layer)
    return jax.nn.silu(matmul(h, p["w_gate"])) * matmul(h, p["w_up"])


def label_logprobs(
    params: Params, inputs: PackedInputs, *, cfg: ModelConfig, family: Family, attention
) -> jax.Array:
    """Full-vocabulary log-probs f32[S, L] of `label_ids` at each score row."""
    x = params["embed"][inputs.tokens].astype(jnp.float32)  # [T, E]
    angles = inputs.positions.astype(jnp.float32)[:, None] * rope_frequencies(cfg)  # [T, D/2]
    cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]
    stacks = {n: w for n, w in params["layers"].items() if isinstance(w, PackedStack)}
    sliced = {n: w for n, w in params["layers"].items() if n not in stacks}

    def layer(x, xs):
        index, p = xs
        p = p | {n: PackedLayer(s.data, index) for n, s in stacks.items()}
        return _layer(
            x, p, cfg=cfg, family=family, attention=attention, meta=inputs.meta, cos=cos, sin=sin
        )

    indices = jnp.arange(cfg.num_layers, dtype=jnp.int32)
    x, _ = jax.lax.scan(layer, x, (indices, sliced))
    h = rms_norm(x[inputs.score_rows], params["final_norm"], cfg.rms_norm_eps)  # [S, E]
    if "packed_head" in params:
        logits = matmul(h, PackedLayer(params["packed_head"].data, jnp.int32(0)))  # [S, V]
    else:
        head = params.get("lm_head", params["embed"])  # [V, E]
        logits = jnp.matmul(h.astype(head.dtype), head.T, preferred_element_type=jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)  # [S, V]
    return jnp.take_along_axis(logp, inputs.label_ids, axis=1)
