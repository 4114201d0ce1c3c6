"""The architecture description shared by every model family, and the parameter layout.

Parameters are a pytree of arrays (numpy at load time, jax once placed), per-layer weights stacked
on a leading layer axis so the forward can `jax.lax.scan` over layers. Matrices are stored
`[in, out]` so activations multiply as `x @ w`:

    embed       [V, E]                  final_norm  [E]
    lm_head     [V, E]                  (absent when `tie_word_embeddings`; a sequence-
                                        classification head's [num_labels, E] in its place)
    layers:
      attn_norm [N, E]                  mlp_norm    [N, E]
      wq        [N, E, H*D]             w_gate      [N, E, I]
      wk        [N, E, Hkv*D]           w_up        [N, E, I]
      wv        [N, E, Hkv*D]           w_down      [N, I, E]
      wo        [N, H*D, E]
      bq [N, H*D], bk [N, Hkv*D], bv [N, Hkv*D]     (only when `qkv_bias`: Qwen2)
      q_norm [N, D], k_norm [N, D]                  (only when `qk_norm`: Qwen3)

Rotary embeddings use the rotate-half layout of Hugging Face checkpoints; loaders of other layouts
(GGUF llama) permute q/k rows back at load time.
"""

import msgspec


class RopeScaling(msgspec.Struct, frozen=True, kw_only=True):
    """Llama-3 style frequency scaling (`rope_type == "llama3"`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the forward needs to know about an architecture; immutable and hashable."""

    family: str  # "llama" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_scaling: RopeScaling | None = None
    # > 0: a sequence-classification head of this many labels replaces the language-model head
    # (`*ForSequenceClassification`); the score rows then give its raw logits
    num_labels: int = 0
    embed_scale: bool = False  # Gemma: embeddings times sqrt(hidden_size)
    mlp_activation: str = "silu"  # "silu", or "gelu_tanh" (Gemma's GeGLU)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes one token costs: 2 * layers * kv_heads * head_dim * dtype_bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def rope_scaling_from_hf(hf: dict) -> RopeScaling | None:
    """The Llama-3 rope scaling block of a Hugging Face config, None when absent or default."""
    rs = hf.get("rope_scaling") or hf.get("rope_parameters")
    if not rs or rs.get("rope_type", rs.get("type")) in (None, "default"):
        return None
    if rs.get("rope_type", rs.get("type")) != "llama3":
        raise ValueError(f"unsupported rope_scaling type {rs.get('rope_type', rs.get('type'))!r}")
    return RopeScaling(
        factor=float(rs["factor"]),
        low_freq_factor=float(rs["low_freq_factor"]),
        high_freq_factor=float(rs["high_freq_factor"]),
        original_max_position_embeddings=int(rs["original_max_position_embeddings"]),
    )


def rope_theta_from_hf(hf: dict, default: float) -> float:
    """`rope_theta`, which newer configs keep inside `rope_parameters`."""
    params = hf.get("rope_parameters") or {}
    return float(hf.get("rope_theta", params.get("rope_theta", default)))


def num_labels_from_hf(hf: dict) -> int:
    """The labels of a `*ForSequenceClassification` checkpoint's head; 0 for a language model."""
    if not any(a.endswith("ForSequenceClassification") for a in hf.get("architectures") or ()):
        return 0
    return int(hf.get("num_labels") or len(hf.get("id2label") or {}) or 2)


def config_from_hf(
    hf: dict, *, family: str, default_theta: float, tie_default: bool = False, **flags
) -> ModelConfig:
    """A ModelConfig from the fields every family's `config.json` shares, type-checked.

    Raises KeyError or TypeError for a missing field, ValueError for a field of the wrong type.
    """
    heads = hf["num_attention_heads"]
    fields = dict(
        family=family,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        intermediate_size=hf["intermediate_size"],
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta_from_hf(hf, default_theta),
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", tie_default)),
        rope_scaling=rope_scaling_from_hf(hf),
        num_labels=num_labels_from_hf(hf),
        **flags,
    )
    return msgspec.convert(fields, ModelConfig)
