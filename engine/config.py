"""The engine's configuration: every knob, immutable, each with a working default."""

import msgspec

from engine.device.kv_pool import DEFAULT_PAGE_SIZE
from engine.device.program import default_compile_cache_dir
from engine.errors import InvalidInput
from engine.host.buckets import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_LABEL_WIDTHS,
    DEFAULT_ROW_DIVISORS,
    DEFAULT_TOKEN_BUDGET,
    Buckets,
    make_buckets,
)


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything that configures an engine. Immutable; every field has a working default."""

    model: str | None = None  # a .gguf file or HF directory; None is the default model
    # weight dtype: "bfloat16" or "float32"; or "int8": bf16 with the layer matrices quantised
    # to int8 at load and multiplied in int8 (docs/int8.md)
    dtype: str = "bfloat16"
    # under dtype "int8", how the layer matrices are rounded to int8: "nearest" (each weight to
    # its nearest grid point) | "gptq" (GPTQ against their inputs in a float32 pass over
    # built-in texts at load, its result kept in compile_cache_dir for the next start;
    # docs/int8.md)
    int8_rounding: str = "nearest"
    # under dtype "int8", SmoothQuant's migration strength alpha in (0, 1]: each layer matrix's
    # input channels divided by max|X|^alpha / max|W|^(1 - alpha) (X from the same float32
    # pass as "gptq", its result kept beside it) and its weights' rows multiplied by it before
    # rounding; 0 smooths nothing (docs/int8.md)
    int8_smoothing: float = 0.0
    # under dtype "int8", the layer matrices left in bf16, by name: "qkv", "o", "up" (the MLP's
    # first product: a gated MLP's gate and up), "down"; the most sensitive (a decoder's down
    # product) buy accuracy with part of int8's speed (docs/int8.md). Needs dense unset
    int8_bf16: tuple[str, ...] = ()
    # "reference" | "xla" | "cpu" | "pallas" | "mosaic" (Hopper+, bf16); None picks by backend
    # (cpu on CPU; mosaic on a Hopper or newer GPU where it runs, else pallas on GPU and TPU)
    attention: str | None = None
    # layer matmuls: "xla" | "cpu" (weights packed once for the native kernel of their dtype:
    # bf16 on AMX, AVX512-BF16 or AVX2, f32 on AVX-512 or AVX2) | "onednn" (oneDNN's bf16
    # matmul, AMX where the CPU has it);
    # under dtype "int8": "int8" (the native kernel: AMX-INT8, VNNI or AVX2) | "int8-xla"; None:
    # each weight shape by the fastest of those that run, measured on this CPU once (kept in
    # compile_cache_dir)
    dense: str | None = None
    # most real tokens in one packed batch; lower it to bound a batch's latency under load
    token_budget: int = DEFAULT_TOKEN_BUDGET
    block_size: int = DEFAULT_BLOCK_SIZE  # attention block (tokens); buckets are multiples of it
    # padded batch sizes in tokens, ascending multiples of block_size; None: powers of two from
    # 2 * block_size to 1024, then four per octave (1024, 1280, 1536, 1792, 2048, 2560, ...) up to
    # the larger of token_budget and the model's context. Buckets up to token_budget are compiled
    # at start; the longest sequence accepted is the smaller of the context and the largest bucket
    token_buckets: tuple[int, ...] | None = None
    row_divisors: tuple[int, ...] = DEFAULT_ROW_DIVISORS  # score-row buckets of T tokens: T // d
    label_widths: tuple[int, ...] = DEFAULT_LABEL_WIDTHS  # padded label counts; last: the limit
    # after answering N requests, how long an idle device waits for N to queue again (the same
    # clients coming back) before batching what is there; a lone request never waits, nor does
    # the rest of a request whose first batch ran; 0 batches at once
    batch_linger_ms: float = 50.0
    max_queued_requests: int = 1024  # in-flight requests before score() fails as overloaded
    max_queued_tokens: int = 2_000_000  # tokenised tokens waiting before requests are refused
    max_items_per_request: int = 4096  # items (or documents, texts) in one request; more: refused
    # tokens whose vectors one token-vector request (`Engine.embed_tokens`, /embed_all) may ask
    # for, each answering the model's hidden size in floats; more: refused
    max_token_vectors_per_request: int = 32768
    tokenizer_cache_size: int = 65536  # texts whose token ids are kept (LRU)
    # encode byte-level BPE texts (GPT-2, Qwen2, Llama 3 pre-tokenizers) in native code, with ids
    # equal to `tokenizers`' (docs/performance-history.md); False: `tokenizers` encodes every text
    native_tokenizer: bool = True
    # KV pool size in bytes (prefix reuse across requests, docs/kv-cache.md); None: an eighth of
    # the device's memory (the host's on CPU; runners sharing it share that), at most what 262144
    # tokens need; 0: no pool (no prefix reuse, no chunked prefill). Refused at start, naming this
    # field, when it does not fit in 90% of the memory free beside the weights
    kv_cache_bytes: int | None = None
    # engines sharing this machine's memory, whose default pools (kv_cache_bytes None) divide
    # it between them: a server of several models sets it to their count
    kv_pool_share: int = 1
    # tokens per pool page (prefixes are cached in whole pages); must divide block_size
    kv_page_size: int = DEFAULT_PAGE_SIZE
    # reuse cached prefixes across requests and batches, and chunk work longer than a batch;
    # False computes every request from scratch
    prefix_cache: bool = True
    # compiled programs, dense-path measurements and GPTQ's int8 roundings kept between starts
    # (None: not kept); by default ~/.cache/llm-scoring-engine/jax
    compile_cache_dir: str | None = msgspec.field(default_factory=default_compile_cache_dir)
    # compile the (T, S, L) grid before serving: each token bucket up to token_budget with each of
    # its row buckets (one by default: 20 programs at the default budget); the compile cache
    # makes a restart load them instead
    precompile: bool = True
    # compile that grid in the background instead, serving at once: a batch whose shape is not
    # compiled yet compiles it first (seconds) rather than every request waiting for the whole
    # grid (20 s for SmolLM2 on a 2-core CPU; at about 4.5 s a program, 90 s for Qwen3-0.6B on
    # an H200, with no compile cache); False: ready only once the grid is compiled
    precompile_in_background: bool = False
    # programs each runner compiles at once (the grid, before serving or behind it). XLA already
    # spreads one compile over the host's cores: two at once on a 2-core CPU took as long as one
    # after the other; on a GPU's host more at once is not yet shown to start sooner
    compile_workers: int = 1
    progress: bool = True  # progress bars while loading and compiling
    # the rerank recipe: "qwen3-reranker" | "mxbai-rerank-v2" | "bge-reranker-v2-gemma" |
    # "chatml" | "plain"; None detects it from the checkpoint (engine.templates.template_for); a
    # cross-encoder takes none (naming one is an error)
    reranker: str | None = None
    # a BGE-M3 rerank's weights of its dense, sparse (lexical) and multi-vector (ColBERT) scores,
    # FlagEmbedding's `weights_for_different_modes`: the relevance is their weighted mean
    # (engine.late_interaction)
    hybrid_weights: tuple[float, float, float] = (1.0, 1.0, 1.0)
    # device runners, each with its own weights, programs and KV pool; None: as many as the
    # local devices make in groups of tensor_parallel
    data_parallel: int | None = None
    # devices each runner's weights and KV pool are sharded over (engine.device.placement)
    tensor_parallel: int = 1

    def buckets(
        self, context: int, window: int = 0, row_divisors: tuple[int, ...] | None = None
    ) -> Buckets:
        """The padding grid for a model of `context` positions and sliding `window`, with score-row
        buckets `row_divisors` (None: this config's `row_divisors`); InvalidInput (a ValueError)
        naming the field that is inconsistent."""
        if not 0 <= self.batch_linger_ms <= 10_000:
            raise InvalidInput("batch_linger_ms", "must be between 0 and 10000")
        if self.kv_page_size < 1 or self.block_size % self.kv_page_size:
            raise InvalidInput("kv_page_size", f"must divide block_size {self.block_size}")
        if self.compile_workers < 1:
            raise InvalidInput("compile_workers", "must be 1 or more")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 0:
            raise InvalidInput("kv_cache_bytes", "must be 0 (no pool) or more")
        return make_buckets(
            context,
            token_budget=self.token_budget,
            block_size=self.block_size,
            token_buckets=self.token_buckets,
            row_divisors=row_divisors or self.row_divisors,
            label_widths=self.label_widths,
            window=window,
        )
