"""A reader of the GGUF container: header, key/value metadata, tensor infos and tensor data.

`gguf.GGUFReader` wraps every value in numpy memmap slices, which takes seconds for the ~100k
vocabulary strings and merges of a real model. This reads values with `struct` straight from the
memory-mapped file and decodes them once, as `ReaderField.contents()` would. Tensor data are
numpy views of the mapping, typed and shaped as `GGUFReader` gives them, so
`gguf.quants.dequantize` takes them unchanged.
"""

import math
import mmap
import os
import struct
from typing import Any, NamedTuple

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFValueType,
)

from engine.loaders.checkpoint import CheckpointError

VERSIONS = (2, 3)

V = GGUFValueType
_SCALAR_CODES = {
    V.UINT8: "B",
    V.INT8: "b",
    V.UINT16: "H",
    V.INT16: "h",
    V.UINT32: "I",
    V.INT32: "i",
    V.FLOAT32: "f",
    V.BOOL: "?",
    V.UINT64: "Q",
    V.INT64: "q",
    V.FLOAT64: "d",
}

Q = GGMLQuantizationType
# ggml types stored as plain elements; any other type is rows of quantised blocks (uint8).
_ELEMENT_TYPES = {
    Q.F16: "f2",
    Q.F32: "f4",
    Q.F64: "f8",
    Q.I8: "i1",
    Q.I16: "i2",
    Q.I32: "i4",
    Q.I64: "i8",
}


class GGUFTensor(NamedTuple):
    """One tensor: `shape` in ggml order (innermost dimension first); `data` a read-only view of
    the file, elements of shape `shape[::-1]` or, for block types, uint8 rows of blocks."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


class GGUFFile(NamedTuple):
    """A parsed GGUF file: `metadata` maps each key to its decoded value (str, int, float, bool,
    or a list of them); `value_types` to its GGUF type; `tensors` are in file order."""

    path: str
    version: int
    metadata: dict[str, Any]
    value_types: dict[str, GGUFValueType]
    tensors: list[GGUFTensor]
    alignment: int
    data_offset: int


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse the GGUF file at `path`; `CheckpointError` naming the file if it is not one."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as file:
            buffer = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        return _Parser(buffer).file(source)
    except (OSError, ValueError, struct.error, RecursionError) as error:
        raise CheckpointError(f"{source}: cannot read as GGUF: {_describe(error)}") from error


def _describe(error: Exception) -> str:
    if isinstance(error, struct.error):
        return "file truncated"
    if isinstance(error, RecursionError):
        return "metadata arrays nested too deeply"
    return str(error)


class _Parser:
    """A cursor over the mapped bytes in the file's byte order."""

    def __init__(self, buffer: mmap.mmap):
        self.buffer = buffer
        self.pos = 0
        self.order = "<"

    def file(self, source: str) -> GGUFFile:
        version = self._header()
        tensor_count, kv_count = self.unpack("QQ")
        metadata, types = self._metadata(kv_count)
        infos = [self._tensor_info() for _ in range(tensor_count)]
        alignment = _alignment(metadata, types)
        data_offset = -(-self.pos // alignment) * alignment
        tensors = self._tensors(infos, data_offset)
        return GGUFFile(source, version, metadata, types, tensors, alignment, data_offset)

    def unpack(self, codes: str) -> tuple:
        layout = struct.Struct(self.order + codes)
        values = layout.unpack_from(self.buffer, self.pos)
        self.pos += layout.size
        return values

    def _header(self) -> int:
        (magic,) = self.unpack("I")
        if magic != GGUF_MAGIC:
            raise ValueError("GGUF magic invalid")
        (version,) = self.unpack("I")
        if version & 0xFFFF == 0:  # written on a machine of the other byte order
            self.order = ">"
            version = int.from_bytes(version.to_bytes(4, "little"), "big")
        if version not in VERSIONS:
            raise ValueError(f"unsupported GGUF version {version} (supported: {list(VERSIONS)})")
        return version

    def _metadata(self, count: int) -> tuple[dict[str, Any], dict[str, GGUFValueType]]:
        metadata, types = {}, {}
        for _ in range(count):
            key = self._string()
            if key in metadata:
                raise ValueError(f"duplicate metadata key {key!r}")
            types[key] = self._type()
            metadata[key] = self._value(types[key])
        return metadata, types

    def _type(self) -> GGUFValueType:
        return GGUFValueType(self.unpack("I")[0])

    def _value(self, kind: GGUFValueType) -> Any:
        if kind == V.STRING:
            return self._string()
        if kind == V.ARRAY:
            item = self._type()
            (count,) = self.unpack("Q")
            return self._array(item, count)
        return self.unpack(_SCALAR_CODES[kind])[0]

    def _array(self, kind: GGUFValueType, count: int) -> list:
        if kind == V.STRING:
            return self._strings(count)
        if kind == V.ARRAY:
            return [self._value(kind) for _ in range(count)]
        dtype = np.dtype(_SCALAR_CODES[kind]).newbyteorder(self.order)
        self._need(count * dtype.itemsize)
        values = np.frombuffer(self.buffer, dtype, count, self.pos)
        self.pos += values.nbytes
        return values.tolist()

    def _string(self) -> str:
        return self._strings(1)[0]

    def _strings(self, count: int) -> list[str]:
        """`count` length-prefixed UTF-8 strings; a plain loop, as this is the hot path."""
        buffer, pos, length = self.buffer, self.pos, struct.Struct(self.order + "Q").unpack_from
        strings = []
        for _ in range(count):
            (size,) = length(buffer, pos)
            pos += 8
            strings.append(str(buffer[pos : pos + size], "utf-8"))
            pos += size
        self.pos = pos
        self._need(0)  # slicing past the end shortens the last string instead of failing
        return strings

    def _need(self, size: int) -> None:
        if self.pos + size > len(self.buffer):
            raise struct.error("truncated")

    def _tensor_info(self) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
        name = self._string()
        (dims,) = self.unpack("I")
        self._need(8 * dims)
        shape = self.unpack("Q" * dims)
        kind, offset = self.unpack("IQ")
        return name, shape, GGMLQuantizationType(kind), offset

    def _tensors(self, infos: list, data_offset: int) -> list[GGUFTensor]:
        tensors, names = [], set()
        for name, shape, kind, offset in infos:
            if name in names:
                raise ValueError(f"duplicate tensor {name!r}")
            names.add(name)
            self.pos = data_offset + offset
            tensors.append(GGUFTensor(name, kind, shape, self._tensor_data(name, shape, kind)))
        return tensors

    def _tensor_data(self, name: str, shape: tuple[int, ...], kind: GGMLQuantizationType):
        dims, dtype = _layout(name, shape, kind, self.order)
        count = math.prod(dims)
        if self.pos + count * dtype.itemsize > len(self.buffer):
            raise ValueError(f"tensor {name!r}: data runs past the end of the file")
        return np.frombuffer(self.buffer, dtype, count, self.pos).reshape(dims)


def _layout(
    name: str, shape: tuple[int, ...], kind: GGMLQuantizationType, order: str
) -> tuple[tuple[int, ...], np.dtype]:
    """The numpy shape and dtype of a tensor's data, as `GGUFReader` gives them: elements, or
    uint8 rows of blocks."""
    dims = shape[::-1]  # numpy order, outermost first
    code = _ELEMENT_TYPES.get(kind)
    if code is not None:
        return dims, np.dtype(code).newbyteorder(order)
    block, size = GGML_QUANT_SIZES[kind]
    if not dims:
        return dims, np.dtype(np.uint8)
    if dims[-1] % block:
        raise ValueError(f"tensor {name!r}: rows of {dims[-1]} are not whole {kind.name} blocks")
    return (*dims[:-1], dims[-1] // block * size), np.dtype(np.uint8)


def _alignment(metadata: dict[str, Any], types: dict[str, GGUFValueType]) -> int:
    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if "general.alignment" in types and types["general.alignment"] != V.UINT32:
        raise ValueError("general.alignment must be a uint32")
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment {alignment} is not a power of two")
    return alignment


_MISSING: Any = object()


def metadata_value(reader: GGUFFile, key: str, path: str | os.PathLike, default: Any = _MISSING):
    """The decoded value of metadata `key`, `default` when absent, else a `CheckpointError`."""
    value = reader.metadata.get(key, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise CheckpointError(f"{os.fspath(path)}: missing GGUF metadata key {key!r}")
        return default
    return value
