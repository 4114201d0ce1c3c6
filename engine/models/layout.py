"""How host weights become device weights: each stack's parameter layout (the decoder's of
`engine.models.decoder`, the encoder's of `engine.models.encoder`), matrices prepared by the
dense strategy, vectors in f32."""

import jax.numpy as jnp
import numpy as np

from engine.models.config import ModelConfig
from kernels.host import to_device

VECTORS = (  # kept in f32
    *("attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm"),
    *("q_norm", "k_norm", "bq", "bk", "bv"),
)


def place_decoder(params: dict, cfg: ModelConfig, dtype, dense) -> dict:
    """A decoder's device weights from host params (the layout of `engine.models.config`): the
    embedding in `dtype`; norms and biases in f32; q/k/v fused into one matrix and gate/up into
    one gated pair (its activation fused where the strategy can), these and the other matrices
    and the head prepared by the `dense` strategy. A tied head is prepared from the embedding
    already on the device, converted once."""
    layers = params["layers"]
    qkv = fuse_qkv(layers["wq"], layers["wk"], layers["wv"], cfg.num_kv_heads)
    embed = to_device(params["embed"], dtype)
    return {
        "embed": embed,
        "final_norm": to_device(params["final_norm"], jnp.float32),
        "head": dense.prepare_head(params.get("lm_head", embed), dtype),
        "layers": {n: to_device(layers[n], jnp.float32) for n in VECTORS if n in layers},
        "matrices": {
            "qkv": dense.prepare(qkv, dtype),
            "o": dense.prepare(layers["wo"], dtype),
            "gate_up": dense.prepare_gated(layers["w_gate"], layers["w_up"], dtype),
            "down": dense.prepare(layers["w_down"], dtype),
        },
    }


ENCODER_VECTORS = (  # kept in f32
    *("attn_norm", "attn_norm_b", "mlp_norm", "mlp_norm_b"),
    *("bq", "bk", "bv", "bo", "b_up", "b_gate", "b_down"),
)
ENCODER_TOP_VECTORS = (
    *("embed_norm", "embed_norm_b", "final_norm", "final_norm_b"),
    *("pool_dense_b", "pool_norm", "pool_norm_b", "classifier_b"),
)


def place_encoder(params: dict, cfg: ModelConfig, dtype, dense) -> dict:
    """Device weights of an encoder (`engine.models.encoder`): embedding tables in `dtype`,
    norms and biases in f32 (the q/k/v biases fused as their matrix where the product takes
    them), the fused q/k/v, the MLP (a gated one's pairs side by side), and a
    cross-encoder's pooler dense and classifier, prepared by the `dense` strategy."""
    layers, heads = params["layers"], cfg.num_kv_heads
    tables = [n for n in ("embed", "positions", "token_types") if n in params]
    qkv = fuse_qkv(layers["wq"], layers["wk"], layers["wv"], heads)
    biased = qkv_bias_in_product(cfg)
    vectors = {n: to_device(layers[n], jnp.float32) for n in ENCODER_VECTORS if n in layers}
    if biased:
        b_qkv = fuse_qkv(layers["bq"], layers["bk"], layers["bv"], heads)
        vectors["b_qkv"] = to_device(b_qkv, jnp.float32)
    up = (
        _gate_up_pairs(layers, dtype, dense)
        if "w_gate" in layers
        else dense.prepare_activated(layers["w_up"], dtype)
    )
    return {
        **{n: to_device(params[n], dtype) for n in tables},
        **{n: to_device(params[n], jnp.float32) for n in ENCODER_TOP_VECTORS if n in params},
        **_classifier(params, dtype, dense),
        "layers": vectors,
        "matrices": {
            "qkv": (dense.prepare_activated if biased else dense.prepare)(qkv, dtype),
            "o": dense.prepare(layers["wo"], dtype),
            "up": up,
            "down": dense.prepare(layers["w_down"], dtype),
        },
    }


def qkv_bias_in_product(cfg: ModelConfig) -> bool:
    """Whether an encoder's q/k/v projection takes its bias in the product (`Dense.activated`
    with the identity, fused bias `b_qkv`): so q, k and v come out in the compute dtype, rounded
    once, where the strategy fuses it. Not where RoPE comes between the projection and attention
    (ModernBERT), which rotates the f32 product."""
    return cfg.position_table


def _classifier(params: dict, dtype, dense) -> dict:
    """A cross-encoder's pooler dense and classifier, prepared; none for an embedder."""
    if "head" not in params:
        return {}
    return {
        "pool_dense": dense.prepare(params["pool_dense"][None], dtype),
        "head": dense.prepare_head(params["head"], dtype),
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
