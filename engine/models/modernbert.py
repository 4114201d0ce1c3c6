"""ModernBERT cross-encoders (gte-reranker-modernbert): pre-norm blocks (the first layer takes
the normed embeddings as they are), RoPE with a global base and a local one, local layers that
see keys within `local_attention // 2` positions on either side (every layer but each
`global_attn_every_n_layers`-th), a GeGLU MLP, no biases, and a head of dense, GELU and
LayerNorm on the first token or the mean of the pair."""

from engine.models.decoder import Family
from engine.models.encoder import config_from_hf


def config(hf: dict):
    if (hf.get("classifier_activation") or "gelu") != "gelu":
        raise ValueError(f"unsupported classifier_activation {hf['classifier_activation']!r}")
    pooling = hf.get("classifier_pooling") or "cls"
    if pooling not in ("cls", "mean"):
        raise ValueError(f"unsupported classifier_pooling {pooling!r}")
    global_theta, local_theta = _rope_bases(hf)
    window = int(hf.get("local_attention") or 0)
    return config_from_hf(
        hf,
        family="modernbert",
        rope_theta=global_theta,
        local_rope_theta=local_theta,
        sliding_window=window,
        sliding_layers=_local_layers(hf) if window else (),
        pooling=pooling,
        pooler="gelu_norm",
        first_block_norm=False,
    )


def _local_layers(hf: dict) -> tuple[bool, ...]:
    n = hf["num_hidden_layers"]
    every = int(hf.get("global_attn_every_n_layers") or 3)
    types = hf.get("layer_types") or [
        "sliding_attention" if i % every else "full_attention" for i in range(n)
    ]
    if len(types) != n or set(types) - {"sliding_attention", "full_attention"}:
        raise ValueError(f"layer_types must name {n} sliding_attention/full_attention layers")
    return tuple(t == "sliding_attention" for t in types)


def _rope_bases(hf: dict) -> tuple[float, float]:
    """(global, local) RoPE bases: per layer type in `rope_parameters` (newer configs), else
    `global_rope_theta` and `local_rope_theta`."""
    params = hf.get("rope_parameters") or {}
    full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    for p in (full, local):
        if p.get("rope_type", "default") != "default":
            raise ValueError(f"unsupported RoPE scaling {p['rope_type']!r} for modernbert")
    return (
        float(full.get("rope_theta", hf.get("global_rope_theta", 160_000.0))),
        float(local.get("rope_theta", hf.get("local_rope_theta", 10_000.0))),
    )


FAMILY = Family(name="modernbert", config_from_hf=config)
