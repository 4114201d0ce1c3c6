"""What every embedding API shares: the engine call (its errors named as the request names its
fields), and the vectors in the number formats the peers answer.

Formats, as Cohere's `embedding_types` and Voyage's `output_dtype` name them:
- `float`: the vector as floats; `base64`: its little-endian f32 bytes, base64-encoded.
- `int8` / `uint8`: each component of the unit vector (the vector over its L2 norm) times 127,
  rounded (plus 128 for `uint8`). One fixed scale, so nothing is clipped, no answer depends on
  the batch it came in, and dot products of two int8 vectors are 127² times their cosine
  similarity, give or take the rounding.
- `binary` / `ubinary`: one bit per component (1 where it is above 0), eight to a byte, first
  component in the high bit; `binary` offset by -128 into int8, as sentence-transformers'
  `quantize_embeddings` and Voyage do.
Over base64 (Voyage's `encoding_format`), each is the bytes of its own type.
"""

import base64

import numpy as np
from starlette.requests import Request

from api.errors import ApiError
from api.service import Service
from engine import EmbedResult, SparseEmbedResult, TokenEmbedResult
from engine.embed import prompt_named

FORMATS = ("float", "int8", "uint8", "binary", "ubinary")


async def embed(
    service: Service,
    request: Request,
    inputs: list,
    renames: dict[str, str],
    input_type: str | None = None,
    verb: str = "embed",
    model: str | None = None,
    **options,
) -> EmbedResult | TokenEmbedResult | SparseEmbedResult:
    """`Engine.embed(inputs, **options)` (or the engine's other embedding `verb`:
    "embed_tokens", "embed_sparse", "embed_multi") where the engine runs, recorded in the
    metrics; engine errors as HTTP answers naming the request's fields (`renames`: the engine's
    name -> the request's). `input_type` ("query", "document", ...) picks the model's prompt of
    that name, where it has one, and multi-vectors' encoding (a ColBERT query's or
    document's). `model`: the request's `model` field, which picks the model that answers
    (`Service.route`)."""

    async def call(engine):
        named = prompt_named(engine.task, input_type)
        given = {"prompt_name": named} if named else {}
        if verb == "embed_multi" and input_type is not None:
            given["input_type"] = input_type
        return await getattr(engine, verb)(inputs, **options, **given)

    name = service.route(request, model)
    result = await service.call(request, call, model=name, renames=renames)
    service.observe(request, result, len(inputs), name)
    return result


def inputs(given, field: str) -> list:
    """A request's inputs (a text, texts, a token-id list or token-id lists) as a list of
    texts or of token-id lists; 400 naming `field` for none, or for an empty one."""
    if isinstance(given, str):
        given = [given]
    elif given and all(isinstance(t, int) for t in given):
        given = [given]  # one token-id list
    if not given:
        raise ApiError(400, f"{field}: must not be an empty list", param=field, empty=True)
    empty = next((i for i, t in enumerate(given) if not t), None)
    if empty is not None:
        at = field if len(given) == 1 else f"{field}[{empty}]"
        raise ApiError(400, f"{at}: must not be empty", param=at, empty=True)
    return given


def formatted(vectors: np.ndarray, kind: str) -> np.ndarray:
    """The vectors f32[N, D] in format `kind` (one of FORMATS): f32[N, D], i8/u8[N, D], or
    i8/u8[N, ceil(D / 8)] for the bit formats."""
    if kind == "float":
        return vectors
    if kind in ("binary", "ubinary"):
        bits = np.packbits(vectors > 0, axis=1)
        return (bits.astype(np.int16) - 128).astype(np.int8) if kind == "binary" else bits
    norms = np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), np.float32(1e-12))
    steps = np.rint(vectors / norms * 127).astype(np.int16)
    return (steps + 128).astype(np.uint8) if kind == "uint8" else steps.astype(np.int8)


def as_lists(vectors: np.ndarray) -> list:
    """Each vector as a JSON list (floats or integers)."""
    return vectors.tolist()


def as_base64(vectors: np.ndarray) -> list[str]:
    """Each vector as base64 of its bytes in its format's type (f32 little-endian, i8, u8)."""
    typed = vectors.astype("<f4") if vectors.dtype.kind == "f" else vectors
    return [base64.b64encode(v.tobytes()).decode("ascii") for v in typed]
