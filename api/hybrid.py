"""`POST /embed_hybrid`: any of each input's dense vector, sparse (lexical) weights and
multi-vectors from one forward of it (`Engine.embed_hybrid`: BGE-M3's three outputs), in TEI's
conventions: its `inputs`, truncation fields and `prompt_name`, its `{"error", "error_type"}`
errors, and an answer per input in input order. No peer computes the three in one pass behind
one request: TEI serves no BGE-M3 sparse or multi-vectors, vLLM each as a pooling task of its
own."""

from typing import Annotated

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api import embed_answers, tei
from api.embeddings import Text, TokenId
from api.errors import ApiError, TeiError
from api.schemas import documented
from api.scoring import json_response, timing_headers
from api.service import Service
from api.tei_embed import Direction, SparseValue


class HybridRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body: the inputs, which outputs to answer, and TEI's options."""

    inputs: Text | Annotated[list[Text | TokenId | list[TokenId]], documented(minItems=1)]
    dense: bool = True  # each input's dense vector
    sparse: bool = True  # its non-zero lexical weights, by vocabulary id
    multi: bool = True  # its multi-vectors (late interaction)
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    prompt_name: str | None = None
    normalize: bool | None = None  # the dense vector's; None: as the model's directory says
    max_active_dims: Annotated[int, msgspec.Meta(ge=1)] | None = None  # sparse entries kept


class HybridEmbedding(msgspec.Struct, kw_only=True, omit_defaults=True):
    dense: list[float] | None = None
    sparse: list[SparseValue] | None = None
    multi: list[list[float]] | None = None


HYBRID_EMBEDDINGS = list[HybridEmbedding]  # per input
decoder = msgspec.json.Decoder(HybridRequest)


async def embed_hybrid(service: Service, request: Request) -> Response:
    """`/embed_hybrid`."""
    try:
        req = await service.decode(request, decoder)
        result = await embed_answers.embed(
            service,
            request,
            embed_answers.inputs(req.inputs, "inputs"),
            {"input": "inputs"},
            verb="embed_hybrid",
            dense=req.dense,
            sparse=req.sparse,
            multi=req.multi,
            truncate=tei.truncates(service, req.truncate),
            truncation_side=req.truncation_direction.lower(),
            prompt_name=req.prompt_name,
            normalize=req.normalize,
            max_active_dims=req.max_active_dims,
        )
    except ApiError as e:
        raise TeiError(e) from None
    n = len(result.dense if result.dense is not None else result.sparse or result.multi)
    answers = [HybridEmbedding() for _ in range(n)]
    for i, answer in enumerate(answers):
        if result.dense is not None:
            answer.dense = result.dense[i].tolist()
        if result.sparse is not None:
            ids, values = result.sparse[i]
            answer.sparse = [
                SparseValue(index=k, value=v)
                for k, v in zip(ids.tolist(), values.tolist(), strict=True)
            ]
        if result.multi is not None:
            answer.multi = result.multi[i].tolist()
    return json_response(answers, headers=timing_headers(result.timings))
