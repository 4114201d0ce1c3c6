"""How host weights become device weights: each stack's parameter layout (the decoder's of
`engine.models.decoder`, the encoder's of `engine.models.encoder`), matrices prepared by the
dense strategy, vectors in f32."""

from typing import Any

import jax.numpy as jnp
import numpy as np

from engine.models.config import ModelConfig
from score_kernels.dense import Dense, Roles, for_role
from score_kernels.host import to_device

VECTORS = (  # kept in f32
    *("attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm"),
    *("q_norm", "k_norm"),
)


def place_decoder(params: dict, cfg: ModelConfig, dtype, dense: Dense | Roles) -> dict:
    """A decoder's device weights from host params (the layout of `engine.models.config`): the
    embedding in `dtype`; norms and biases in f32; q/k/v fused into one matrix (their biases
    into one vector, `_qkv`) and gate/up into one gated pair (its activation fused where the
    strategy can), these and the other matrices and the head prepared by the `dense` strategy
    (of each role, where it is `Roles`). A tied head is prepared from the embedding already on
    the device, converted once."""
    layers = params["layers"]
    qkv, b_qkv = _qkv(layers, cfg, dtype, for_role(dense, "qkv"))
    embed = to_device(params["embed"], dtype)
    gated = for_role(dense, "up")
    return {
        "embed": embed,
        "final_norm": to_device(params["final_norm"], jnp.float32),
        "head": for_role(dense, None).prepare_head(params.get("lm_head", embed), dtype),
        "layers": {n: to_device(layers[n], jnp.float32) for n in VECTORS if n in layers} | b_qkv,
        "matrices": {
            "qkv": qkv,
            "o": _output(layers["wo"], cfg, dtype, for_role(dense, "o")),
            "gate_up": gated.prepare_gated(layers["w_gate"], layers["w_up"], dtype),
            "down": _output(layers["w_down"], cfg, dtype, for_role(dense, "down")),
        },
    }


def _output(w: np.ndarray, cfg: ModelConfig, dtype, dense: Dense):
    """A decoder's o or down stack, prepared for `Dense.residual` where `adds_residual`."""
    return (dense.prepare_residual if adds_residual(cfg) else dense.prepare)(w, dtype)


ENCODER_VECTORS = (  # kept in f32
    *("attn_norm", "attn_norm_b", "mlp_norm", "mlp_norm_b"),
    *("bo", "b_up", "b_gate", "b_down"),
)
ENCODER_TOP_VECTORS = (
    *("embed_norm", "embed_norm_b", "final_norm", "final_norm_b"),
    *("pool_dense_b", "pool_norm", "pool_norm_b", "classifier_b"),
    *("mlm_dense_b", "mlm_norm", "mlm_norm_b", "mlm_decoder_b"),
    *("m3_colbert_b", "m3_sparse", "m3_sparse_b", "colbert_proj_b"),
)


def place_encoder(params: dict, cfg: ModelConfig, dtype, dense: Dense | Roles) -> dict:
    """Device weights of an encoder (`engine.models.encoder`): embedding tables in `dtype`,
    norms and biases in f32 (the q/k/v biases fused as their matrix), the fused q/k/v, the MLP
    (a gated one's pairs side by side), and a cross-encoder's pooler dense and classifier,
    prepared by the `dense` strategy (of each role, where it is `Roles`)."""
    layers = params["layers"]
    tables = [n for n in ("embed", "positions", "token_types") if n in params]
    qkv, b_qkv = _qkv(layers, cfg, dtype, for_role(dense, "qkv"))
    vectors = {n: to_device(layers[n], jnp.float32) for n in ENCODER_VECTORS if n in layers}
    up_dense, base = for_role(dense, "up"), for_role(dense, None)
    up = (
        _gate_up_pairs(layers, dtype, up_dense)
        if "w_gate" in layers
        else up_dense.prepare_activated(layers["w_up"], dtype)
    )
    return {
        **{n: to_device(params[n], dtype) for n in tables},
        **{n: to_device(params[n], jnp.float32) for n in ENCODER_TOP_VECTORS if n in params},
        **_classifier(params, dtype, base),
        **_mlm_head(params, dtype, base),
        **_multi_vector_heads(params, dtype, base),
        "layers": vectors | b_qkv,
        "matrices": {
            "qkv": qkv,
            "o": for_role(dense, "o").prepare_residual(layers["wo"], dtype),
            "up": up,
            "down": for_role(dense, "down").prepare_residual(layers["w_down"], dtype),
        },
    }


def adds_residual(cfg: ModelConfig) -> bool:
    """Whether a decoder's o and down products are added onto the residual stream as they are
    written (`Dense.residual`): all but those that norm the outputs before the add
    (`sandwich_norms`: Gemma 2, 3), which are plain products. An encoder's always are."""
    return not cfg.sandwich_norms


def fused_qkv(cfg: ModelConfig) -> bool:
    """Whether a model's q/k/v projection is one `Dense.qkv` call (the product, its fused bias
    `b_qkv` and RoPE; bf16 q, k and v where the strategy fuses it): all but those with per-head
    norms between the product and RoPE (`qk_norm`: Qwen3, Gemma 3), which are plain products."""
    return not cfg.qk_norm


def _qkv(layers: dict, cfg: ModelConfig, dtype, dense) -> tuple[Any, dict]:
    """The fused q/k/v stack prepared (`fuse_qkv`), and where `fused_qkv`, its bias {"b_qkv":
    f32[L, N]} (zeros for a model without biases)."""
    heads = cfg.num_kv_heads
    w = fuse_qkv(layers["wq"], layers["wk"], layers["wv"], heads)
    if not fused_qkv(cfg):
        if "bq" in layers:
            raise ValueError("q/k/v biases with per-head q/k norms are not supported")
        return dense.prepare(w, dtype), {}
    if "bq" in layers:
        bias = fuse_qkv(layers["bq"], layers["bk"], layers["bv"], heads)
    else:
        bias = np.zeros((w.shape[0], w.shape[-1]), np.float32)
    prepared = dense.prepare_qkv(w, dtype, cfg.num_heads, cfg.num_kv_heads)
    return prepared, {"b_qkv": to_device(bias, jnp.float32)}


def _classifier(params: dict, dtype, dense) -> dict:
    """A cross-encoder's pooler dense and classifier, prepared; none for an embedder."""
    if "head" not in params:
        return {}
    return {
        "pool_dense": dense.prepare(params["pool_dense"][None], dtype),
        "head": dense.prepare_head(params["head"], dtype),
    }


def _multi_vector_heads(params: dict, dtype, dense) -> dict:
    """BGE-M3's or a ColBERT model's multi-vector projection, prepared; none for other
    encoders (BGE-M3's lexical head is a vector, kept in f32)."""
    names = [n for n in ("m3_colbert", "colbert_proj") if n in params]
    return {n: dense.prepare(params[n][None], dtype) for n in names}


def _mlm_head(params: dict, dtype, dense) -> dict:
    """A SPLADE model's masked-language-model transform and vocabulary rows (the embedding
    table where they are tied), prepared; none for other encoders."""
    if "mlm_dense" not in params:
        return {}
    rows = params.get("mlm_decoder", params["embed"])  # [V, E]
    return {
        "mlm_dense": dense.prepare(params["mlm_dense"][None], dtype),
        "mlm_decoder": dense.prepare_head(rows, dtype),
    }


def fuse_qkv(wq: np.ndarray, wk: np.ndarray, wv: np.ndarray, kv_heads: int) -> np.ndarray:
    """The fused projection [L, E, (H + 2 Hkv) D] from wq [L, E, H D], wk and wv [L, E, Hkv D],
    by kv head: the G = H / Hkv query heads that read kv head j, then k and v of head j
    (`engine.models.decoder.project` splits it). Any split of the columns into a number of
    equal parts that divides Hkv (tensor parallelism) keeps whole heads with their k and v."""
    lead = wq.shape[:-1]
    by_head = [w.reshape(*lead, kv_heads, -1) for w in (wq, wk, wv)]  # [L, E, Hkv, G D | D | D]
    return np.concatenate(by_head, axis=-1).reshape(*lead, -1)


def _gate_up_pairs(layers: dict, dtype, dense):
    """A gated encoder MLP's gate and up as one plain matrix [L, E, 2I] of their columns side by
    side, whose product the forward splits (its biases come before the activation)."""
    pair = np.stack([layers["w_gate"], layers["w_up"]], axis=-1)  # [L, E, I, 2]
    return dense.prepare(pair.reshape(*pair.shape[:-2], -1), dtype)
