"""JAX profiler traces over HTTP: `POST /start_profile` into the configured directory (or a
subdirectory of it), `POST /stop_profile`; one trace at a time."""

from pathlib import Path

import anyio
import jax
from starlette.requests import Request
from starlette.responses import Response

from api import schemas
from api.errors import ApiError
from api.scoring import json_response
from api.service import Service


async def start_profile(service: Service, request: Request) -> Response:
    """Start a JAX profiler trace into the configured directory or a subdirectory of it named by
    `output_dir`; 400 for a path leaving that root, 409 if a trace runs."""
    req = await service.decode(request, schemas.profile_decoder, empty=schemas.ProfileRequest())
    directory = profile_directory(service.settings.server.profile_dir, req.output_dir)
    if service.profiling is not None:
        raise ApiError(409, f"a profile is already running into {service.profiling}")
    try:
        await anyio.to_thread.run_sync(jax.profiler.start_trace, directory)
    except (RuntimeError, OSError) as e:
        raise ApiError(409, f"profiler: {e}") from None
    service.profiling = directory
    return json_response(schemas.ProfileResponse(status="started", output_dir=directory))


def profile_directory(root: str, output_dir: str | None) -> str:
    """`root`, or `output_dir` resolved under it; ApiError 400 when it would leave the root."""
    base = Path(root).resolve()
    if output_dir is None:
        return str(base)
    # a NUL names no file: resolve() would raise ValueError
    target = None if "\0" in output_dir else (base / output_dir).resolve()
    if target is None or Path(output_dir).is_absolute() or not target.is_relative_to(base):
        raise ApiError(
            400,
            "output_dir: must be a relative path inside the profile directory",
            param="output_dir",
        )
    return str(target)


async def stop_profile(service: Service, request: Request) -> Response:
    await service.decode(request, schemas.profile_decoder, empty=schemas.ProfileRequest())
    directory = service.profiling
    if directory is None:
        raise ApiError(409, "no profile is running")
    service.profiling = None
    await anyio.to_thread.run_sync(jax.profiler.stop_trace)
    return json_response(schemas.ProfileResponse(status="stopped", output_dir=directory))
