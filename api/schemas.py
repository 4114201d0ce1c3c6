"""Request and response bodies of the HTTP API, one msgspec Struct each.

Requests forbid unknown fields; their decoders are built once here. Responses are encoded with
`encode`. `/openapi.json` is generated from these same types (see `api.openapi`).
"""

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from api.settings import ServerConfig
from engine import DenseChoice, EngineConfig, EngineStats, KVPoolInfo

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


def documented(**json_schema) -> msgspec.Meta:
    # the engine checks these and names the field; stating them in the schema only keeps its
    # messages (msgspec's would replace them)
    return msgspec.Meta(extra_json_schema=json_schema)


TokenId = Annotated[int, documented(minimum=0)]
TokenIds = list[TokenId]
Labels = Annotated[list[TokenId], documented(minItems=1)]
# as SGLang: an empty query, item or item list is allowed; only a sequence of no token is not
Items = str | list[str | TokenIds]


class ScoreRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """sglang's `/v1/score` body: label-token probabilities for each item after the query.

    A text query takes text items, a token-id query token-id lists. Token ids are below the
    model's vocabulary size and each query + item sequence fits its context (`/get_model_info`).
    """

    query: str | TokenIds
    items: Items  # text items, or token-id lists; never a mix
    label_token_ids: Labels
    apply_softmax: bool = False  # softmax over the labels instead of full-vocabulary probs
    item_first: bool = False  # item + query instead of query + item
    model: str | None = None  # echoed in the answer (the served model's name when absent)


class PromptTokensDetails(msgspec.Struct, kw_only=True, omit_defaults=True):
    cached_tokens: int  # prompt tokens read from the KV cache instead of computed
    # input tokens a cross-encoder's pair truncation left out (its max length), not counted in
    # prompt_tokens; only there when a pair was truncated
    truncated_tokens: int | None = None


def _no_details() -> PromptTokensDetails:
    return PromptTokensDetails(cached_tokens=0)


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = msgspec.field(default_factory=_no_details)


class ScoreResponse(msgspec.Struct, kw_only=True):
    scores: list[list[float]]  # per item, per label
    model: str
    usage: Usage
    object: str = "scoring"


NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
# a document as text, or as a flat JSON object whose `text` (or `rank_fields`) is ranked
DocumentIn = str | dict[str, str | int | float | bool | None]


class RerankRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One rerank body for every client: Cohere (v1, v2), Jina, vLLM, SGLang, Voyage, TEI and
    Mixedbread spell it differently, and each spelling is read (docs/clients.md's table says
    what each field does). Give the documents as `documents`, `texts` or `input`: one of them.
    """

    query: str  # not empty, but for TEI's requests
    documents: Annotated[list[DocumentIn], documented(minItems=1)] | None = None
    texts: Annotated[list[str], documented(minItems=1)] | None = None  # TEI
    input: Annotated[list[DocumentIn], documented(minItems=1)] | None = None  # Mixedbread
    top_n: NonNegativeInt | None = None  # None or 0: every document
    top_k: NonNegativeInt | UnsetType | None = UNSET  # Voyage, Mixedbread: as top_n
    rank_fields: list[str] | None = None  # the object fields ranked, as "field: value" lines
    return_documents: bool | None = None  # None: the answer's own default (docs/clients.md)
    return_text: bool | None = None  # TEI
    return_input: bool | None = None  # Mixedbread
    instruction: str | None = None  # None: the template's default instruction
    instruct: str | None = None  # SGLang's spelling of `instruction`
    max_tokens_per_doc: PositiveInt | None = None  # truncate each document to this many tokens
    truncate: bool | None = None  # TEI: truncate documents so that each prompt fits the context
    truncation: bool | UnsetType = UNSET  # Voyage (default true): as `truncate`
    truncation_direction: Literal["Left", "Right", "left", "right"] = "Right"  # TEI
    raw_scores: bool = False  # TEI: the yes/no logit instead of its sigmoid
    use_activation: bool | None = None  # vLLM: false gives raw scores
    truncate_prompt_tokens: Annotated[int, msgspec.Meta(ge=-1)] | None = None  # vLLM (docs/http.md)
    max_chunks_per_doc: PositiveInt | None = None  # Cohere v1: accepted; never chunked here
    priority: int | None = None  # Cohere v2, vLLM: accepted; requests run in arrival order
    rewrite_query: bool | None = None  # Mixedbread: accepted; the query is used as given
    model: str | None = None  # echoed in answers that carry a model


class RerankUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = msgspec.field(default_factory=_no_details)


def usage_of(kind, result):
    """The token usage (`kind`: `Usage` or `RerankUsage`) of an engine result, cached prompt
    tokens spelled as OpenAI does."""
    details = PromptTokensDetails(
        cached_tokens=result.cached_tokens,
        truncated_tokens=getattr(result, "truncated_tokens", 0) or None,
    )
    tokens = result.prompt_tokens
    return kind(prompt_tokens=tokens, total_tokens=tokens, prompt_tokens_details=details)


class ProfileRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    output_dir: str | None = None  # a subdirectory of the profile directory; None: itself


class ProfileResponse(msgspec.Struct, kw_only=True):
    status: str  # "started" | "stopped"
    output_dir: str


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None  # the offending field's path, e.g. "items[1]"
    code: int  # the HTTP status, as vLLM and OpenAI-style clients read it


class ErrorResponse(msgspec.Struct, kw_only=True):
    """OpenAI's and vLLM's `error` object, SGLang's flat fields beside it, and the message as
    Voyage's (and FastAPI's) `detail`."""

    error: ErrorDetail
    message: str
    type: str
    param: str | None
    code: int
    detail: str
    object: str = "error"


class TeiErrorResponse(msgspec.Struct, kw_only=True):
    """TEI's error body."""

    error: str
    error_type: str  # "Validation", "Empty", "Overloaded", "Backend", "Unhealthy"


class HealthResponse(msgspec.Struct, kw_only=True):
    status: str  # "ok" | "loading" | "failed"
    message: str | None = None


class ModelCard(msgspec.Struct, kw_only=True):
    """An OpenAI model card, with what the served model is (null while the engine loads)."""

    id: str
    created: int  # when the server started, Unix seconds
    max_model_len: int | None  # the tokens one input may have (an embedder's max_seq_length)
    family: str | None = None  # "llama", "qwen2", "qwen3"
    dtype: str | None = None  # the weights' dtype: "bfloat16" or "float32"
    vocab_size: int | None = None
    context_length: int | None = None  # the model's own context (positions)
    kv_bytes_per_token: int | None = None  # K and V of every layer, in the weights' dtype
    # "language-model" (label-token scores and rerank) or "sequence-classification" (rerank and
    # vLLM's /score only: /v1/score is a 400)
    head: str | None = None
    # "decoder" (causal, query and item joined) or "cross-encoder" (each query/document pair
    # encoded as a pair, every token seeing all of it)
    architecture: str | None = None
    num_labels: int | None = None  # the classification head's labels; 0 for a language model
    # the rerank recipe (`EngineConfig.reranker`); "cross-encoder": the pair as it is
    rerank_template: str | None = None
    endpoints: list[str] | None = None  # the scoring routes this model answers
    # those of them at which a request naming no model is answered by this one (all of them
    # where one model is served)
    default_endpoints: list[str] | None = None
    object: str = "model"
    owned_by: str = "llm-scoring-engine"


class ModelList(msgspec.Struct, kw_only=True):
    data: list[ModelCard]
    object: str = "list"


class ModelInfo(msgspec.Struct, kw_only=True):
    """sglang's `/get_model_info`, with the facts of `ModelCard` and the rerank template."""

    model_path: str | None  # the checkpoint: a .gguf file or a Hugging Face directory
    tokenizer_path: str | None
    is_generation: bool  # always false: the server scores, it never generates
    model_name: str
    family: str
    dtype: str
    vocab_size: int
    context_length: int
    max_sequence_tokens: int
    kv_bytes_per_token: int
    head: str  # "language-model" or "sequence-classification" (no /v1/score)
    architecture: str  # "decoder" or "cross-encoder"
    num_labels: int  # the classification head's labels; 0 for a language model
    rerank_template: str  # the rerank recipe (`EngineConfig.reranker`)
    endpoints: list[str]  # the scoring routes this model answers


class BucketGrid(msgspec.Struct, kw_only=True):
    """The padding grid of packed batches (see `engine.host.buckets.Buckets`)."""

    block_size: int
    tokens: list[int]  # token buckets
    row_divisors: list[int]  # score-row buckets of a T-token batch: T // d
    label_widths: list[int]  # padded label counts; the last is the limit
    contexts: list[int]  # context-region sizes: keys a batch reads from the KV pool
    window: int = 0  # the model's sliding window (0: none): batches carry its spans too


class DevicePlan(msgspec.Struct, kw_only=True):
    """The model's memory figures on one device kind (`engine.plan.capacity`)."""

    memory_bytes: int
    weight_bytes: int
    kv_bytes_per_token: int
    default_pool_tokens: int  # the pool the engine makes by default there
    capacity_tokens: int  # tokens a pool could hold in all the weights leave


class ServerInfo(msgspec.Struct, kw_only=True):
    """`/get_server_info`: the configuration (never the API key), the padding grid and the
    engine's counters; the engine's parts are null while it loads."""

    version: str
    model: str
    status: str  # "ready" | "loading" | "failed"
    async_library: str  # the server's: "asyncio" or "trio"
    auth: bool  # whether requests need the API key
    engine_config: EngineConfig
    server_config: ServerConfig  # its api_key is always null
    buckets: BucketGrid | None
    kv_bytes_per_token: int | None
    kv_pool: KVPoolInfo | None
    # the measured dense strategy's choice per weight shape and each candidate's GFLOP/s on this
    # machine (null for a forced `dense`, and off the CPU)
    dense: DenseChoice | None
    # per device kind ("cpu" is this host; h100, h200, tpu-v5e, tpu-v6e): `python -m engine.plan`
    plan: dict[str, DevicePlan] | None
    # with `?roofline=1`: the whole `python -m engine.plan` report of the loaded model, W1/W2
    # roofline estimates included (computed on the first such request: it compiles)
    roofline: dict[str, Any] | None
    max_sequence_tokens: int | None
    stats: EngineStats | None
    profiling: str | None  # the trace directory while a profile runs


score_decoder = msgspec.json.Decoder(ScoreRequest)
rerank_decoder = msgspec.json.Decoder(RerankRequest)
profile_decoder = msgspec.json.Decoder(ProfileRequest)
encode = msgspec.json.Encoder().encode
