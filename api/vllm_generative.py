"""vLLM's generative scoring, `POST /generative_scoring`: for each item, the probability of the
first label token after the query's tokens joined with the item's, in vLLM's answer (`data[i]
.score`, usage counting the one token each item would generate).

As vLLM builds the prompt: the query tokenised with the tokenizer's special tokens (unless
`add_special_tokens` is false), each item without, their token ids joined (the item first with
`item_first`). `apply_softmax` (true by default) normalises over the labels; false gives the
model's probability over its whole vocabulary. Unlike vLLM, a prompt over the model's context is
refused (400), never cut. The sampling fields vLLM accepts (`temperature`, `top_k`, `top_p`) do
not change a probability and are accepted as such.
"""

import time
import uuid
from typing import Annotated

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api.errors import ApiError
from api.schemas import Labels, TokenId, documented
from api.scoring import json_response, timing_headers
from api.service import Service

Item = str | Annotated[list[TokenId], documented(minItems=1)]


class GenerativeScoringRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's generative scoring body."""

    query: str | list[TokenId]  # text, or token ids
    items: Annotated[list[Item], documented(minItems=1)]  # texts, or token-id lists (not mixed)
    label_token_ids: Labels  # the first one's probability is each item's score
    model: str | None = None  # echoed
    apply_softmax: bool = True  # over the labels; false: over the whole vocabulary
    item_first: bool = False
    add_special_tokens: bool = True  # the query's (an item never gets them)
    priority: int = 0  # accepted
    request_id: str | None = None  # names the answer's id
    temperature: float | None = None  # accepted: no probability depends on it
    top_k: int | None = None
    top_p: float | None = None


class GenerativeScore(msgspec.Struct, kw_only=True):
    index: int
    score: float  # the first label's probability
    object: str = "score"


class GenerativeUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int  # one per item: the token a generation would add


class GenerativeScoringResponse(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    data: list[GenerativeScore]
    usage: GenerativeUsage
    object: str = "list"


decoder = msgspec.json.Decoder(GenerativeScoringRequest)


async def generative_scoring(service: Service, request: Request) -> Response:
    """vLLM's `/generative_scoring`."""
    req = await service.decode(request, decoder)
    _check(req)
    name = service.route(request, req.model)
    tokenizer = service.engine(name).tokenizer
    query, items = await anyio.to_thread.run_sync(_token_ids, tokenizer, req)
    result = await service.call(
        request,
        lambda engine: engine.score(
            query,
            items,
            req.label_token_ids,
            apply_softmax=req.apply_softmax,
            item_first=req.item_first,
        ),
        model=name,
    )
    service.observe(request, result, len(items), name)
    generated = len(items)
    body = GenerativeScoringResponse(
        id=f"generative-scoring-{req.request_id or uuid.uuid4().hex}",
        created=int(time.time()),
        model=req.model or name,
        data=[GenerativeScore(index=i, score=s[0]) for i, s in enumerate(result.scores)],
        usage=GenerativeUsage(
            prompt_tokens=result.prompt_tokens,
            completion_tokens=generated,
            total_tokens=result.prompt_tokens + generated,
        ),
    )
    return json_response(body, headers=timing_headers(result.timings))


def _check(req: GenerativeScoringRequest) -> None:
    """400 naming the field, with vLLM's words, for what its schema leaves open."""
    if not req.label_token_ids:
        message = "label_token_ids must contain at least one token ID."
        raise ApiError(400, f"label_token_ids: {message}", param="label_token_ids")
    if not req.items:
        raise ApiError(400, "items: items must contain at least one item.", param="items")
    kind = type(req.items[0])
    mixed = next((i for i, it in enumerate(req.items) if type(it) is not kind), None)
    if mixed is not None:
        field = f"items[{mixed}]"
        raise ApiError(400, f"{field}: all items are texts or all token ids", param=field)


def _token_ids(tokenizer, req: GenerativeScoringRequest) -> tuple[list[int], list[list[int]]]:
    """The query's and the items' token ids, as vLLM tokenises their texts."""
    query = req.query
    if isinstance(query, str):
        query = tokenizer.encode(query, add_special_tokens=req.add_special_tokens).ids
    items = req.items
    if items and isinstance(items[0], str):
        items = [e.ids for e in tokenizer.encode_batch_fast(items, add_special_tokens=False)]
    return query, items
