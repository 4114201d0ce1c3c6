"""Request and response bodies of the HTTP API, one msgspec Struct each.

Requests forbid unknown fields; their decoders are built once here. Responses are encoded with
`encode`. `/openapi.json` is generated from these same types (see `api.openapi`).
"""

from typing import Annotated

import msgspec

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


def _documented(**json_schema) -> msgspec.Meta:
    # the engine checks these and names the field; stating them in the schema only keeps its
    # messages (msgspec's would replace them)
    return msgspec.Meta(extra_json_schema=json_schema)


TokenId = Annotated[int, _documented(minimum=0)]
TokenIds = Annotated[list[TokenId], _documented(minItems=1)]
Text = Annotated[str, _documented(minLength=1)]
Items = Text | Annotated[list[Text | TokenIds], _documented(minItems=1)]


class ScoreRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """sglang's `/v1/score` body: label-token probabilities for each item after the query.

    A text query takes text items, a token-id query token-id lists. Token ids are below the
    model's vocabulary size and each query + item sequence fits its context (`/get_model_info`).
    """

    query: Text | TokenIds
    items: Items  # text items, or token-id lists; never a mix
    label_token_ids: TokenIds
    apply_softmax: bool = False  # softmax over the labels instead of full-vocabulary probs
    item_first: bool = False  # item + query instead of query + item
    model: str | None = None  # accepted for compatibility; the served model answers


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreResponse(msgspec.Struct, kw_only=True):
    scores: list[list[float]]  # per item, per label
    model: str
    usage: Usage
    object: str = "scoring"


class Document(msgspec.Struct, forbid_unknown_fields=True):
    text: str


class RerankRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Cohere/Jina rerank body; `texts`, `return_text` and `truncate` are TEI's spellings.

    Give the documents as `documents` or as `texts`, not both.
    """

    query: Text
    documents: Annotated[list[str | Document], _documented(minItems=1)] | None = None
    texts: Annotated[list[str], _documented(minItems=1)] | None = None
    top_n: PositiveInt | None = None  # None: every document
    return_documents: bool | None = None
    return_text: bool | None = None
    instruction: str | None = None  # None: the template's default instruction
    max_tokens_per_doc: PositiveInt | None = None  # truncate each document to this many tokens
    truncate: bool = False  # truncate documents so that each prompt fits the context
    model: str | None = None


class RerankHit(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    relevance_score: float
    document: Document | None = None


class RerankUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(msgspec.Struct, kw_only=True):
    id: str
    model: str
    results: list[RerankHit]  # best first
    usage: RerankUsage


class ProfileRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    output_dir: str | None = None  # a subdirectory of the profile directory; None: itself


class ProfileResponse(msgspec.Struct, kw_only=True):
    status: str  # "started" | "stopped"
    output_dir: str


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None  # the offending field's path, e.g. "items[1]"


class ErrorResponse(msgspec.Struct, kw_only=True):
    error: ErrorDetail


class HealthResponse(msgspec.Struct, kw_only=True):
    status: str  # "ok" | "loading" | "failed"
    message: str | None = None


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    created: int
    max_model_len: int | None
    object: str = "model"
    owned_by: str = "llm-scoring-engine"


class ModelList(msgspec.Struct, kw_only=True):
    data: list[ModelCard]
    object: str = "list"


score_decoder = msgspec.json.Decoder(ScoreRequest)
rerank_decoder = msgspec.json.Decoder(RerankRequest)
profile_decoder = msgspec.json.Decoder(ProfileRequest)
encode = msgspec.json.Encoder().encode

REQUESTS = (ScoreRequest, RerankRequest, ProfileRequest)
RESPONSES = (
    ScoreResponse,
    RerankResponse,
    ProfileResponse,
    ErrorResponse,
    HealthResponse,
    ModelList,
)
