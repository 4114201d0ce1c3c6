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
      q_norm [N, D], k_norm [N, D]                  (only when `qk_norm`: Qwen3, Gemma 3)
      post_attn_norm [N, E], post_mlp_norm [N, E]   (only when `sandwich_norms`: Gemma 2, 3)

Rotary embeddings use the rotate-half layout of Hugging Face checkpoints; loaders of other layouts
(GGUF llama) permute q/k rows back at load time.
"""

import msgspec


class RopeScaling(msgspec.Struct, frozen=True, kw_only=True):
    """RoPE frequency scaling: "llama3" (Llama 3.1's smoothed band; the other fields are its) or
    "linear" (every frequency divided by `factor`, as Gemma 3's global layers)."""

    factor: float
    rope_type: str = "llama3"
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


class DenseLayer(msgspec.Struct, frozen=True, kw_only=True):
    """A sentence-transformers Dense module after the pooling: `activation(x @ W.T + b)`, its
    weights read from `path`'s `model.safetensors` when the vectors are made."""

    path: str  # the module's directory
    in_features: int
    out_features: int
    activation: str  # a key of `engine.tasks.pooler.ACTIVATIONS`


class Pooling(msgspec.Struct, frozen=True, kw_only=True):
    """How an embedder makes one vector of a sequence's token states (sentence-transformers'
    Pooling and Normalize modules), and the prompts its texts may be given."""

    # "cls": the first token, "max": the elementwise max of every token's, encoders'; "last": the
    # last token, a decoder's; "mean": of every token (special ones included), either's
    mode: str
    normalize: bool = False  # divided by its L2 norm
    prompts: tuple[tuple[str, str], ...] = ()  # (name, text put before a text given that name)
    default_prompt: str | None = None  # the prompt name a text gets when none is asked for
    # trained so that a vector's first components are themselves an embedding (Matryoshka), at
    # these widths (empty: at any width)
    matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()
    dense: tuple[DenseLayer, ...] = ()  # applied in order after the pooling, before Normalize


class Splade(msgspec.Struct, frozen=True, kw_only=True):
    """How a SPLADE model makes a sparse vector of a text (sentence-transformers' SparseEncoder:
    a masked-language-model head, then SpladePooling): every token's MLM logits over the
    vocabulary, log(1 + relu(x)) of each ("log1p_relu": log(1 + log(1 + relu(x)))), pooled
    over the text's tokens by their `pooling` ("max" or "sum")."""

    pooling: str = "max"
    activation: str = "relu"
    prompts: tuple[tuple[str, str], ...] = ()  # as `Pooling.prompts`
    default_prompt: str | None = None


class M3Heads(msgspec.Struct, frozen=True, kw_only=True):
    """BGE-M3's two heads beside its dense vector (FlagEmbedding's `BGEM3FlagModel`): a lexical
    weight per token, relu(h . w + b), and a multi-vector per token, normalize(h W + b)."""

    colbert_dim: int  # the multi-vectors' width
    # token ids whose lexical weights are dropped: the tokenizer's cls, eos, pad and unk
    unused: tuple[int, ...] = ()


class ColBERT(msgspec.Struct, frozen=True, kw_only=True):
    """A late-interaction (ColBERT) model's encoding, as PyLate's `ColBERT` (and the older
    colbert-ir checkpoints) make it: each token's state projected to `dim` (`colbert_proj`) and
    normalised. A text is encoded as a query or a document: its marker's id put after its first
    token, the whole held to that role's length; a query padded with `pad_id` to
    `query_length` (`expand`; the pads seen by no token unless `attend_expansion`), a
    document's `skiplist` tokens dropped from its vectors."""

    dim: int  # the multi-vectors' width
    query_marker: int | None = None  # None: no marker
    document_marker: int | None = None
    query_length: int = 32
    document_length: int = 180
    expand: bool = True
    attend_expansion: bool = False
    pad_id: int = 0  # the expansion token (the tokenizer's mask token)
    skiplist: tuple[int, ...] = ()  # token ids whose vectors a document leaves out
    prompts: tuple[tuple[str, str], ...] = ()  # as `Pooling.prompts`
    default_prompt: str | None = None


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the forward needs to know about an architecture; immutable and hashable."""

    family: str  # a key of `engine.models.FAMILIES`
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float  # every norm's epsilon: RMSNorm's in decoders, LayerNorm's in encoders
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
    mlp_activation: str = "silu"  # "silu", "gelu_tanh" (Gemma's GeGLU) or "gelu" (erf)
    # Gemma 2 and 3: sliding-window layers see only their last `sliding_window` keys
    sliding_window: int = 0
    sliding_layers: tuple[bool, ...] = ()  # per layer: a sliding-window layer (none: all global)
    local_rope_theta: float = 0.0  # RoPE base of sliding layers, unscaled (0: as global ones)
    attn_softcap: float = 0.0  # attention scores soft-capped at this (0: not)
    final_softcap: float = 0.0  # language-model logits soft-capped at this (0: not)
    query_scale: float = 0.0  # attention score scale (0: head_dim ** -0.5)
    sandwich_norms: bool = False  # attention and MLP outputs normed before the residual add
    # the encoder stack (BERT, XLM-RoBERTa, ModernBERT; `engine.models.encoder`): every token of
    # a sequence sees all of it, LayerNorms (eps `norm_eps`), a classifier head; what that
    # means for requests, packing and the KV cache is the task's (`engine.tasks`)
    encoder: bool = False
    post_norm: bool = False  # BERT's LayerNorm after each residual add (else before each block)
    first_block_norm: bool = True  # False: the first block takes the normed embeddings as they are
    position_table: bool = False  # learned absolute positions (else RoPE)
    position_offset: int = 0  # first position id (XLM-RoBERTa: padding_idx + 1)
    type_vocab_size: int = 0  # token-type (segment) embeddings; ids coded `type * vocab + id`
    gated_mlp: bool = True  # act(x @ gate) * (x @ up); False: BERT's act(x @ up)
    pooling: str = "cls"  # the classifier reads the first token ("cls") or the mean ("mean")
    pooler: str = "tanh"  # "tanh": dense, tanh (BERT); "gelu_norm": dense, GELU, LayerNorm
    max_length: int = 0  # pairs are truncated to this many tokens (CrossEncoder's default)
    # an embedder (no classifier): each sequence pooled into one vector; its texts are cut to
    # `max_length` tokens only when asked (sentence-transformers' max_seq_length)
    embedding: Pooling | None = None
    # a SPLADE model (no classifier, no pooling): each text's sparse vector over the vocabulary
    # from its masked-language-model head (`mlm_*` parameters of `engine.models.encoder`)
    splade: Splade | None = None
    mlm_activation: str = "gelu"  # of the MLM head's transform (dense, activation, LayerNorm)
    # BGE-M3 (an embedder with a lexical and a multi-vector head): its `m3_*` parameters
    m3: M3Heads | None = None
    # a late-interaction (ColBERT) model: its `colbert_proj*` parameters
    colbert: ColBERT | None = None

    @property
    def attention_scale(self) -> float:
        return self.query_scale or self.head_dim**-0.5

    @property
    def window(self) -> int:
        """The window sliding layers need in the packed metadata; 0 when no layer slides."""
        return self.sliding_window if any(self.sliding_layers) else 0

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes one token costs: 2 * layers * kv_heads * head_dim * dtype_bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def rope_scaling_from_hf(hf: dict) -> RopeScaling | None:
    """The rope scaling block of a Hugging Face config (or a `rope_parameters` entry), None when
    absent or default; ValueError for a type other than "llama3" and "linear"."""
    rs = hf.get("rope_scaling") or hf.get("rope_parameters")
    kind = rs and rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return None
    if kind == "linear":
        return RopeScaling(rope_type="linear", factor=float(rs["factor"]))
    if kind != "llama3":
        raise ValueError(f"unsupported rope_scaling type {kind!r}")
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
    """A ModelConfig from the fields every family's `config.json` shares, type-checked;
    `flags` set the rest and override any of them.

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
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta_from_hf(hf, default_theta),
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", tie_default)),
        rope_scaling=rope_scaling_from_hf(hf),
        num_labels=num_labels_from_hf(hf),
    )
    return msgspec.convert(fields | flags, ModelConfig)
