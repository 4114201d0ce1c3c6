"""vLLM's binary encoding of vectors in `base64` answers (`/v1/embeddings` and `/pooling`): the
number type each component is stored as (`embed_dtype`: float32, float16, bfloat16, or an fp8
form: e4m3 or e5m2) and the byte order of the multi-byte ones (`endianness`: native, big,
little), rounded to nearest as torch's `.to(dtype)` rounds."""

import base64
import sys
from typing import Literal

import ml_dtypes
import numpy as np

from api import embed_answers
from api.errors import ApiError

EmbedDType = Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]
Endianness = Literal["native", "big", "little"]
_TYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
}
_ORDER = {"little": "<", "big": ">", "native": "<" if sys.byteorder == "little" else ">"}


def typed(vector: np.ndarray, dtype: str, endianness: str) -> bytes:
    """A vector f32[D]'s components as `dtype` in `endianness`' byte order."""
    values = np.asarray(vector, np.float32).astype(_TYPES[dtype])
    raw = values.view(f"u{values.itemsize}")  # the stored bits, as unsigned integers
    return raw.astype(raw.dtype.newbyteorder(_ORDER[endianness])).tobytes()


def as_base64(vectors, dtype: str, endianness: str) -> list[str]:
    """Each vector (f32[D], or a multi-vector f32[n, D] flattened) as base64 of `typed`."""
    return [
        base64.b64encode(typed(np.ravel(v), dtype, endianness)).decode("ascii") for v in vectors
    ]


def encoder(dtype: str, endianness: str, output: str):
    """What encodes a request's vectors of Voyage's `output` type as base64: vLLM's `dtype` and
    `endianness` for floats; 400 naming `embed_dtype` where both an integer type and vLLM's
    encoding are asked for."""
    if output == "float":
        return lambda vectors: as_base64(vectors, dtype, endianness)
    if (dtype, endianness) != ("float32", "native"):
        why = "embed_dtype: vLLM's encoding applies to float vectors, not to output_dtype"
        raise ApiError(400, f"{why} {output}", param="embed_dtype")
    return embed_answers.as_base64


def activation(use_activation: bool | None, normalize: bool | None) -> bool | None:
    """Whether vectors are normalised: vLLM's `use_activation`, or its older name `normalize`
    (None: as the model's directory says); 400 naming `use_activation` where they differ."""
    if use_activation is None:
        return normalize
    if normalize is not None and normalize != use_activation:
        why = "use_activation: `normalize` is its older name; give one of them"
        raise ApiError(400, why, param="use_activation")
    return use_activation
