"""Server settings: one frozen struct, read from `SCORING_*` environment variables at start.

Every `EngineConfig` field has a variable (`SCORING_TOKEN_BUDGET` for `token_budget`, ...), and so
has every server field below. Tuples are comma-separated; an empty value of an optional field is
None (`SCORING_COMPILE_CACHE_DIR=` disables the compile cache); booleans are 1/0/true/false.
"""

import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import msgspec
import msgspec.inspect as mi

from api.served import ServedModel, served_models
from engine import EngineConfig

PREFIX = "SCORING_"
log = logging.getLogger("api")


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the HTTP layer adds to the engine's configuration."""

    model_name: str | None = None  # served name (`model` fields, /v1/models); None: the file's stem
    # a TOML or JSON file listing several models to serve, each its own engine, with its served
    # name and any engine field (docs/serving-several-models.md); None: the one model above
    models: str | None = None
    # when set, every route but /health and /ping needs `Authorization: Bearer <api_key>`
    api_key: str | None = None
    max_body_bytes: int = 16 * 2**20  # a larger request body is answered 413
    # where /start_profile writes JAX profiler traces (its `output_dir`: a subdirectory)
    profile_dir: str = str(Path(tempfile.gettempdir()) / "llm-scoring-engine-profile")
    retry_after_s: int = 1  # the Retry-After of a 503
    cors_origins: tuple[str, ...] = ()  # origins allowed to call from a browser; empty: CORS off
    log_level: str = "INFO"  # the `api` logger's level
    # the answer of /v1/rerank: Cohere's object (Jina's, vLLM's), or SGLang's bare list
    rerank_format: Literal["cohere", "sglang"] = "cohere"
    # TEI's `--auto-truncate` (its default since 1.9): a TEI request that does not say
    # `truncate` has its over-long texts cut to the model's limit; false: refused unless it asks
    tei_auto_truncate: bool = True
    # OpenTelemetry tracing (docs/dashboard.md): the OTLP/HTTP protobuf traces endpoint that
    # gets a span of each engine request with a child span per stage
    # (`http://collector:4318/v1/traces`; `collector:4318` gets `http://` and `/v1/traces`);
    # None: tracing off. Needs the `tracing` extra
    otlp_traces_endpoint: str | None = None
    otlp_service_name: str = "llm-scoring-engine"  # the spans' `service.name`


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the service runs with."""

    engine: EngineConfig = msgspec.field(default_factory=EngineConfig)
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)

    @property
    def models(self) -> tuple[ServedModel, ...]:
        """The models served (`api.served`): the engine configured here, or `server.models`'."""
        return served_models(self.server.models, self.engine, self.server.model_name)

    @property
    def model_name(self) -> str:
        """The name of the (first) model served."""
        return self.models[0].name


def settings_from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from `SCORING_*` variables; ValueError naming the variable that is wrong."""
    environ = os.environ if environ is None else environ
    known = {PREFIX + f.name.upper() for cls in (EngineConfig, ServerConfig) for f in _fields(cls)}
    for name in sorted(n for n in environ if n.startswith(PREFIX) and n not in known):
        log.warning("ignoring unknown setting %s", name)
    return Settings(
        engine=_from_env(EngineConfig, environ), server=_from_env(ServerConfig, environ)
    )


def _from_env(cls, environ: Mapping[str, str]):
    raw = {
        f.name: _parse(f.type, environ[PREFIX + f.name.upper()])
        for f in _fields(cls)
        if PREFIX + f.name.upper() in environ
    }
    try:
        return msgspec.convert(raw, cls, strict=False)
    except msgspec.ValidationError as e:
        field = str(e).rpartition("$.")[2].rstrip("`").split("[")[0]
        raise ValueError(f"{PREFIX}{field.upper()}: {e}") from None


def _fields(cls) -> tuple:
    return mi.type_info(cls).fields


def _parse(kind, value: str):
    """The raw value of one variable, shaped for `msgspec.convert(strict=False)`."""
    kinds = kind.types if isinstance(kind, mi.UnionType) else (kind,)
    if value.strip() == "" and any(isinstance(k, mi.NoneType) for k in kinds):
        return None
    if any(isinstance(k, mi.VarTupleType | mi.TupleType | mi.ListType) for k in kinds):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value
