"""SageMaker's inference path, `POST /invocations`: whatever body kind it is sent, answered as
the route of that kind answers it. A body with `input` (and no `query`: Mixedbread's rerank
names its documents so) is an embeddings request (vLLM's `/pooling` with a field of its own,
`task` or `embedding_mode`, else `/v1/embeddings`); one with `inputs` TEI's (`/embed_sparse` on
a sparse encoder, else `/embed`); a score or rerank body is scored or reranked
(`api.scoring.score_or_rerank`)."""

from starlette.requests import Request
from starlette.responses import Response

from api import embeddings, tei_embed, vllm_pooling
from api.scoring import keys_of, score_or_rerank, scoring_route
from api.service import Service
from engine.capabilities import Ability

POOLING_ONLY = {"task", "embedding_mode"}  # `input` bodies that are vLLM's /pooling's


async def invocations(service: Service, request: Request) -> Response:
    """`/invocations` (see the module docstring)."""
    body = await service.body(request)
    keys = keys_of(body)
    if "query" in keys or not keys & {"input", "inputs"}:  # a rerank or a score
        # Mixedbread's rerank names its documents `input`
        path = scoring_route(keys)
        return await score_or_rerank(service, _replayed(request, body, path), body)
    if "input" in keys:
        path = "/pooling" if keys & POOLING_ONLY else "/v1/embeddings"
    else:  # a sparse encoder's TEI body is its /embed_sparse's, where none embeds dense
        path = "/embed_sparse" if _only_sparse(service, request, body) else "/embed"
    return await ROUTES[path](service, _replayed(request, body, path))


def _only_sparse(service: Service, request: Request, body: bytes) -> bool:
    """Whether the model a TEI body would go to embeds sparse vectors and no dense ones."""

    def offers(path: str, ability: Ability) -> bool:
        engine = service.engine(service.route(_replayed(request, body, path)))
        return engine.capabilities.offers(ability)

    return not offers("/embed", Ability.EMBED) and offers("/embed_sparse", Ability.EMBED_SPARSE)


ROUTES = {
    "/pooling": vllm_pooling.pooling,
    "/v1/embeddings": embeddings.embeddings,
    "/embed": tei_embed.embed,
    "/embed_sparse": tei_embed.embed_sparse,
}


def _replayed(request: Request, body: bytes, path: str) -> Request:
    """`request` as if sent to `path`, the route that answers its body (which model answers
    it is that route's choice: `Service.route`), with its body, already read, to be read again
    by that route; what it receives after that is the connection's own (a client that
    leaves)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        return pending.pop() if pending else await request.receive()

    return Request(request.scope | {"path": path, "raw_path": path.encode()}, receive)
