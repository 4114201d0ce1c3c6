"""TEI's own routes besides `/rerank`: `/info` (what serves, in TEI's fields) and SageMaker's
`/ping` health check."""

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api.errors import ApiError, TeiError
from api.schemas import encode
from api.served import model_path
from api.service import Service

RERANKER = {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
POOLING = {"last": "last_token"}  # TEI's names for the pooling modes it names differently


class TeiInfo(msgspec.Struct, kw_only=True):
    """TEI's `/info`: every field of TEI's, null where nothing here matches."""

    model_id: str  # the checkpoint
    model_dtype: str
    served_model_name: str
    # {"reranker": {"id2label", "label2id"}}: one relevance score per text; an embedder's
    # {"embedding": {"pooling"}}
    model_type: dict
    max_concurrent_requests: int  # requests in flight before a 429
    max_input_length: int  # the longest query + document prompt, in tokens
    max_batch_tokens: int  # the token budget of one packed batch
    max_client_batch_size: int  # texts per request
    # true: a request that does not say `truncate` has its over-long texts cut (the server's
    # `tei_auto_truncate`); a cross-encoder's pairs are always cut to its max length
    auto_truncate: bool
    tokenization_workers: int
    version: str
    model_sha: str | None = None
    max_batch_requests: int | None = None
    sha: str | None = None
    docker_label: str | None = None


async def info(service: Service, request: Request, version: str) -> Response:
    """TEI's `/info`; 503 while the engine loads."""
    try:
        engine = service.engine()
    except ApiError as e:
        raise TeiError(e) from None
    config = engine.config
    body = TeiInfo(
        model_id=model_path(config.model) or service.model_name,
        model_dtype=engine.info().dtype,
        served_model_name=service.model_name,
        model_type=_model_type(engine),
        max_concurrent_requests=config.max_queued_requests,
        max_input_length=engine.max_input_tokens,  # as TEI reads it: max_seq_length
        max_batch_tokens=config.token_budget,
        max_client_batch_size=config.max_items_per_request,
        # pairs are cut as CrossEncoder cuts them, whatever the setting
        auto_truncate=service.settings.server.tei_auto_truncate or engine.task.reads_pairs,
        tokenization_workers=1,
        version=version,
    )
    return Response(encode(body), media_type="application/json")


def truncates(service: Service, given: bool | None) -> bool:
    """Whether a TEI request's over-long texts are cut: as its `truncate` says, else as the
    server's `tei_auto_truncate` (TEI's `--auto-truncate`)."""
    return service.settings.server.tei_auto_truncate if given is None else given


def _model_type(engine) -> dict:
    pooling = engine.model_config.embedding
    if pooling is None:
        return RERANKER
    return {"embedding": {"pooling": POOLING.get(pooling.mode, pooling.mode)}}


async def ping(service: Service, request: Request) -> Response:
    """SageMaker's (and TEI's) health check: 200 with no body once ready, else TEI's 503."""
    try:
        service.engine()
    except ApiError as e:
        raise TeiError(e) from None
    return Response(status_code=200)
