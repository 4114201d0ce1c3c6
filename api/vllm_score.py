"""vLLM's score API on `/score` and `/v1/score`: the rerank relevance of query/document pairs,
in pair order. vLLM spells the two sides `queries` + `documents` (or + `items`), `text_1` +
`text_2` or `data_1` + `data_2`, each a string or a list: 1:1, 1:N or N:N pairs. On
`/v1/score` these fields tell vLLM's body from SGLang's (`query`, `items`, `label_token_ids`).
"""

import time
import uuid
from typing import Annotated

import msgspec
from msgspec import UNSET, UnsetType

from api.errors import ApiError
from api.schemas import Usage, usage_of

Side = str | list[str]
SIDES = (("queries", "documents"), ("queries", "items"), ("text_1", "text_2"), ("data_1", "data_2"))
KEYS = frozenset({"queries", "documents", "text_1", "text_2", "data_1", "data_2"})


class VllmScoreRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's score body: one pair of sides, and the options of its pooling requests."""

    queries: Side | UnsetType = UNSET
    documents: Side | UnsetType = UNSET
    items: Side | UnsetType = UNSET
    text_1: Side | UnsetType = UNSET
    text_2: Side | UnsetType = UNSET
    data_1: Side | UnsetType = UNSET
    data_2: Side | UnsetType = UNSET
    model: str | None = None  # echoed
    truncate_prompt_tokens: Annotated[int, msgspec.Meta(ge=-1)] | None = None  # -1: the context
    max_tokens_per_doc: Annotated[int, msgspec.Meta(ge=0)] = 0  # 0: documents are not cut
    max_tokens_per_query: Annotated[int, msgspec.Meta(ge=0)] = 0  # only 0: queries are never cut
    use_activation: bool | None = None  # false: the yes/no logit instead of its sigmoid
    activation: bool | None = None  # older vLLM's `use_activation`
    softmax: bool | None = None  # older still
    priority: int = 0  # accepted; requests run in arrival order
    user: str | None = None  # accepted
    request_id: str | None = None  # accepted; the answer's id is its own
    mm_processor_kwargs: dict | None = None  # accepted; text only


class VllmScoreData(msgspec.Struct, kw_only=True):
    index: int  # the pair's position
    score: float
    object: str = "score"


class VllmScoreResponse(msgspec.Struct, kw_only=True):
    id: str
    created: int  # Unix seconds
    model: str
    data: list[VllmScoreData]  # in pair order
    usage: Usage
    object: str = "list"


decoder = msgspec.json.Decoder(VllmScoreRequest)


class Pairs(msgspec.Struct, frozen=True):
    queries: list[str]  # one per pair
    documents: list[str]
    names: tuple[str, str]  # the request's names of the two sides


def pairs_of(req: VllmScoreRequest) -> Pairs:
    """The request's pairs; 400 for no sides, two spellings, or lengths that do not pair."""
    present = {name for pair in SIDES for name in pair if getattr(req, name) is not UNSET}
    names = next((pair for pair in SIDES if set(pair) == present), None)
    if names is None:
        raise ApiError(
            400,
            "give the two sides as `queries` and `documents` (or `items`), `text_1` and "
            "`text_2`, or `data_1` and `data_2`: one pair of them",
        )
    left, right = ([x] if isinstance(x, str) else x for x in map(req.__getattribute__, names))
    if not left:
        raise ApiError(400, "At least one text element must be given", param=names[0])
    if not right:
        raise ApiError(400, "At least one text_pair element must be given", param=names[1])
    if len(left) > 1 and len(left) != len(right):
        raise ApiError(400, "Input lengths must be either 1:1, 1:N or N:N", param=names[1])
    queries = left * len(right) if len(left) == 1 else left
    return Pairs(queries, right, names)


def raw_scores(req: VllmScoreRequest) -> bool:
    """Whether the answer is the yes/no logit: any activation switch set to false."""
    return False in (req.use_activation, req.activation, req.softmax)


def response(scores: list[float], result, model: str) -> VllmScoreResponse:
    """vLLM's answer: one score per pair, in pair order, and the result's usage."""
    return VllmScoreResponse(
        id=f"score-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        data=[VllmScoreData(index=i, score=s) for i, s in enumerate(scores)],
        usage=usage_of(Usage, result),
    )
