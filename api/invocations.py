"""SageMaker's inference path, `POST /invocations`: whatever body kind it is sent, answered as
the route of that kind answers it. A body with `input` (and no `query`: Mixedbread's rerank
names its documents so) is an embeddings request (vLLM's `/pooling` with a field of its own,
`task` or `embedding_mode`, else `/v1/embeddings`); one with `inputs` TEI's (`/embed_sparse` on
a sparse encoder, else `/embed`); a score or rerank body is scored or reranked
(`api.scoring.score_or_rerank`)."""

from starlette.requests import Request
from starlette.responses import Response

from api import embeddings, tei_embed, vllm_pooling
from api.scoring import keys_of, score_or_rerank
from api.service import Service
from engine.capabilities import Ability

POOLING_ONLY = {"task", "embedding_mode"}  # `input` bodies that are vLLM's /pooling's


async def invocations(service: Service, request: Request) -> Response:
    """`/invocations` (see the module docstring)."""
    body = await service.body(request)
    keys = keys_of(body)
    if "query" in keys:  # a rerank (Mixedbread's documents are its `input`) or a score
        return await score_or_rerank(service, request, body)
    if "input" in keys:
        pooling = bool(keys & POOLING_ONLY)
        route = vllm_pooling.pooling if pooling else embeddings.embeddings
    elif "inputs" in keys:
        sparse = service.engine(service.route(request)).capabilities.offers(Ability.EMBED_SPARSE)
        route = tei_embed.embed_sparse if sparse else tei_embed.embed
    else:
        return await score_or_rerank(service, request, body)
    return await route(service, _replayed(request, body))


def _replayed(request: Request, body: bytes) -> Request:
    """`request` with its body, already read, to be read again by the route it is handed to;
    what it receives after that is the connection's own (a client that leaves)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        return pending.pop() if pending else await request.receive()

    return Request(request.scope, receive)
