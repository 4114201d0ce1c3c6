"""XLM-RoBERTa cross-encoders in llama.cpp's GGUF: a tiny random HF checkpoint converted here as
llama.cpp's `convert_hf_to_gguf.py` lays it out loads as the same model (config, parameters, pair
tokens, rerank scores), and what the loader does not support is refused naming the file."""

import json
import os

import numpy as np
import pytest
import trio
from gguf import (
    GGUFWriter,
    LlamaFileType,
    PoolingType,
    SpecialVocab,
    TokenType,
    get_tensor_name_map,
)
from gguf.constants import MODEL_ARCH
from tokenizers import Tokenizer
from tokenizers.models import Unigram

from bench.encoders import write_encoder
from engine import EngineConfig, open_engine
from engine.host.pairs import PairEncoder, PairOptions
from engine.loaders import CheckpointError, load_checkpoint
from engine.loaders.gguf_file import read_gguf
from engine.loaders.gguf_tokenizer import tokenizer_from_gguf
from tests.conftest import CORPUS, TINY_ENCODER
from tests.test_encoders import hf_logits

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")  # write_encoder saves a transformers model

FIELDS = dict(  # hidden 64: the refusal cases name these shapes
    TINY_ENCODER,
    hidden_size=64,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=130,
    type_vocab_size=1,
    layer_norm_eps=1e-5,
)
MAX_LENGTH = 128  # model_max_length: all 130 - 2 positions, which is what a GGUF gives

QUERY = "Is this document relevant to the query?"
DOCUMENTS = [
    *CORPUS[:6],
    "",
    "x",
    "  leading and trailing spaces  ",
    "runs   of\t\tspaces,\n\nnewlines\r\nand tabs",
    "special tokens inline: <s> </s> <pad> <mask> <unk> end",
    "never seen: Ω ж ק ש 😀 🦙 ∑∫ ︙",
    "MiXeD CaSe and digits 0123456789 3.14 2024-11-22",
    "The quick brown fox jumps over the lazy dog near the river bank. " * 6,
]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf-encoder") / "xlm-roberta"
    return write_encoder(
        path,
        "XLMRobertaConfig",
        FIELDS,
        "xlm-roberta",
        seed=7,
        corpus=CORPUS,
        model_max_length=MAX_LENGTH,
        vocab=300,
        perturb=0.3,
    )


@pytest.fixture(scope="module", params=["f32", "f16"])
def gguf_path(request, hf_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf-encoder") / f"reranker-{request.param}.gguf"
    # the f16 file also carries the pooling type some published files have
    return _convert(hf_dir, path, half=request.param == "f16", rank=request.param == "f16")


# --- llama.cpp's conversion ----------------------------------------------------------------------


def _convert(hf_dir, out, *, half: bool = False, rank: bool = False, drop=(), pooling=None) -> str:
    """What `convert_hf_to_gguf.py` writes for an XLMRobertaForSequenceClassification directory
    with a tokenizer.json (conversion/bert.py: XLMRobertaModel over BertModel, on TextModel's
    metadata and tensor types), less what its charsmap step needs: this tokenizer.json has no
    normalizer, so no `precompiled_charsmap` is written."""
    hf = json.loads((hf_dir / "config.json").read_text())
    offset = hf["pad_token_id"] + 1  # _xlmroberta_tokenizer_init
    writer = GGUFWriter(os.fspath(out), "bert")
    writer.add_block_count(hf["num_hidden_layers"])
    writer.add_context_length(hf["max_position_embeddings"] - offset)
    writer.add_embedding_length(hf["hidden_size"])
    writer.add_feed_forward_length(hf["intermediate_size"])
    writer.add_head_count(hf["num_attention_heads"])
    writer.add_layer_norm_eps(hf["layer_norm_eps"])
    writer.add_file_type(LlamaFileType.MOSTLY_F16 if half else LlamaFileType.ALL_F32)
    writer.add_causal_attention(False)
    if rank:  # the converter writes one only from a sentence-transformers Pooling module
        writer.add_pooling_type(PoolingType.RANK)
    if pooling is not None:  # an embedder's, from its Pooling module
        writer.add_pooling_type(pooling)
    writer.add_classifier_output_labels([label for _, label in sorted(hf["id2label"].items())])
    _write_vocab(writer, hf_dir, hf)
    for name, weight in _tensors(hf_dir, hf, offset):
        if name not in drop:
            writer.add_tensor(name, _stored(name, weight, half))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return os.fspath(out)


def _write_vocab(writer: GGUFWriter, hf_dir, hf: dict) -> None:
    """`_xlmroberta_set_vocab` on a tokenizer.json: pieces and scores by id, padded past the
    tokenizer to the model's vocabulary with UNUSED `[PAD{id}]` entries."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    model = json.loads((hf_dir / "tokenizer.json").read_text())["model"]
    tok_config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    size = max(hf["vocab_size"], tokenizer.vocab_size)
    tokens = [f"[PAD{i}]" for i in range(size)]
    scores = [-10000.0] * size
    types = [TokenType.UNUSED] * size
    added = tokenizer.get_added_vocab()
    unk = added.get(tok_config.get("unk_token"), model.get("unk_id", 3))
    for i in range(tokenizer.vocab_size):
        tokens[i] = tokenizer.convert_ids_to_tokens(i)
        scores[i] = model["vocab"][i][1]
        if i == unk:
            types[i] = TokenType.UNKNOWN
        elif i in tokenizer.all_special_ids:
            types[i] = TokenType.CONTROL
        elif i in added.values():
            types[i] = TokenType.USER_DEFINED
        else:
            types[i] = TokenType.NORMAL
    writer.add_tokenizer_model("t5")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_add_space_prefix(tokenizer.add_prefix_space)
    writer.add_token_type_count(hf.get("type_vocab_size", 1))
    writer.add_remove_extra_whitespaces(tokenizer.clean_up_tokenization_spaces)
    SpecialVocab(hf_dir, n_vocab=len(tokens)).add_to_gguf(writer)


def _tensors(hf_dir, hf: dict, offset: int):
    """(GGUF name, f32 [out, in]) by gguf-py's name map for BERT, `roberta.` dropped and the
    position rows below the offset cut off."""
    from safetensors.numpy import load_file

    names = get_tensor_name_map(MODEL_ARCH.BERT, hf["num_hidden_layers"])
    for name, weight in load_file(hf_dir / "model.safetensors").items():
        name = name.removeprefix("roberta.")
        if name.startswith("pooler."):  # an XLMRobertaModel's pooler: the converter drops it
            continue
        if name == "embeddings.position_embeddings.weight":
            weight = weight[offset:]
        yield names.get_name(name, try_suffixes=(".weight", ".bias")), weight.astype(np.float32)


def _stored(name: str, weight: np.ndarray, half: bool) -> np.ndarray:
    """TextModel's tensor types for `--outtype f16`: 2-D weights f16 except the position and
    token-type tables; vectors and biases f32."""
    tables = ("position_embd.weight", "token_types.weight")
    if half and weight.ndim == 2 and name.endswith(".weight") and name not in tables:
        return weight.astype(np.float16)
    return weight


# --- the same model ------------------------------------------------------------------------------


def test_config_equals_hf(hf_dir, gguf_path):
    ours = load_checkpoint(gguf_path, progress=False)
    theirs = load_checkpoint(hf_dir, progress=False)
    assert ours.config == theirs.config
    assert (ours.config.family, ours.config.position_offset) == ("xlm-roberta", 2)
    assert (ours.config.max_length, ours.config.num_labels) == (MAX_LENGTH, 1)


def test_params_equal_hf(hf_dir, gguf_path):
    ours = load_checkpoint(gguf_path, progress=False).params
    theirs = load_checkpoint(hf_dir, progress=False).params
    half = gguf_path.endswith("f16.gguf")
    assert set(ours) == set(theirs)
    assert set(ours["layers"]) == set(theirs["layers"])
    # the converter cuts the rows below the offset; they come back as zeros
    np.testing.assert_array_equal(ours["positions"][:2], 0.0)
    _equal(ours["positions"][2:], theirs["positions"][2:], half=False)
    for name in sorted(set(ours) - {"layers", "positions"}):
        _equal(ours[name], theirs[name], half=half and name in ("embed", "pool_dense", "head"))
    for name, stack in ours["layers"].items():
        _equal(stack, theirs["layers"][name], half=half and stack.ndim == 3)


def _equal(ours: np.ndarray, theirs: np.ndarray, *, half: bool) -> None:
    """Exactly equal, after the f16 rounding the file stores when `half`."""
    theirs = np.asarray(theirs, np.float32)
    want = theirs.astype(np.float16).astype(np.float32) if half else theirs
    assert ours.dtype == np.float32 and ours.shape == want.shape
    np.testing.assert_array_equal(ours, want)


@pytest.mark.parametrize("limit, side", [(MAX_LENGTH, "right"), (24, "right"), (24, "left")])
def test_pair_tokens_equal_hf(hf_dir, gguf_path, limit, side):
    ours = load_checkpoint(gguf_path, progress=False)
    theirs = load_checkpoint(hf_dir, progress=False)
    cfg = ours.config
    options = PairOptions(limit=limit, side=side)
    encoders = [
        PairEncoder(c.tokenizer, vocab_size=cfg.vocab_size, type_vocab_size=cfg.type_vocab_size)
        for c in (ours, theirs)
    ]
    for query in (QUERY, DOCUMENTS[-3], "  ", "<s>"):
        got, want = (e.encode(query, DOCUMENTS, options) for e in encoders)
        assert got == want
    pair = theirs.tokenizer.encode(QUERY, "a document")
    assert pair.tokens[:1] == ["<s>"] and pair.tokens[-1:] == ["</s>"]
    assert ours.tokenizer.encode(QUERY, "a document").tokens == pair.tokens
    for text in DOCUMENTS:
        assert ours.tokenizer.encode(text).ids == theirs.tokenizer.encode(text).ids


def test_pairs_without_add_flags_as_llama_cpp_built_them(hf_dir, f32_path, tmp_path):
    """Files converted before gguf-py wrote `add_{bos,eos,sep}_token`: llama.cpp's rerank then
    added all three, which is the original's template."""
    flags = [f"tokenizer.ggml.add_{name}_token" for name in ("bos", "eos", "sep")]
    path = _rewritten(f32_path, tmp_path / "old.gguf", drop_keys=flags)
    ours = load_checkpoint(path, progress=False).tokenizer
    theirs = load_checkpoint(hf_dir, progress=False).tokenizer
    for doc in DOCUMENTS:
        assert ours.encode(QUERY, doc).ids == theirs.encode(QUERY, doc).ids


def test_padding_entries_leave_unknown_characters_priced_as_the_original(tmp_path):
    """Unigram prices an unknown character at the least score less 10; the converter's padding
    entries (-10000) must not lower it. "▁Ωxy": "▁" + unknown "Ω" + "xy" (-32 with the real
    least score, -20) beats "▁" + "Ωx" + "y" (-41), which would win at -10010."""
    pieces = ["<s>", "<pad>", "</s>", "<unk>", "▁", "x", "y", "xy", "Ωx"]
    scores = [0.0, 0.0, 0.0, 0.0, -1.0, -20.0, -20.0, -1.0, -20.0]
    types = [TokenType.CONTROL] * 3 + [TokenType.UNKNOWN] + [TokenType.NORMAL] * 5
    path = os.fspath(tmp_path / "padded.gguf")
    writer = GGUFWriter(path, "bert")
    writer.add_tokenizer_model("t5")
    writer.add_token_list([*pieces, "[PAD9]", "[PAD10]"])
    writer.add_token_scores([*scores, -10000.0, -10000.0])
    writer.add_token_types([*types, TokenType.UNUSED, TokenType.UNUSED])
    writer.add_unk_token_id(3)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    ours = tokenizer_from_gguf(read_gguf(path), path)
    original = Tokenizer(Unigram(list(zip(pieces, scores, strict=True)), unk_id=3))
    original.pre_tokenizer = ours.pre_tokenizer
    want = original.encode("Ωxy", add_special_tokens=False).ids
    assert want == [4, 3, 7]  # "▁", "<unk>", "xy"
    assert ours.encode("Ωxy", add_special_tokens=False).ids == want
    assert ours.encode("[PAD9] [PAD10]").ids.count(9) == 0  # never matched


def test_rerank_scores_equal_hf(hf_dir, gguf_path):
    want = _rerank(hf_dir, DOCUMENTS)
    got = _rerank(gguf_path, DOCUMENTS)
    # f16 weights: measured 4.4e-4 (docs/cross-encoders.md's figure); f32 files: identical
    atol = 6e-4 if gguf_path.endswith("f16.gguf") else 1e-6
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)
    assert np.ptp(want) > 0.05  # the documents score differently
    # and both against transformers on the original weights, not only against each other
    logits = hf_logits(hf_dir, QUERY, DOCUMENTS, max_length=MAX_LENGTH)[:, -1]
    np.testing.assert_allclose(want, logits, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got, logits, rtol=0, atol=atol + 1e-5)


def _rerank(model, docs: list[str]) -> np.ndarray:
    """Raw scores in document order."""
    config = EngineConfig(
        model=str(model), dtype="float32", progress=False, precompile=False, compile_cache_dir=None
    )

    async def main():
        async with open_engine(config) as engine:
            return await engine.rerank(QUERY, docs, raw_scores=True)

    by_index = {h.index: h.relevance_score for h in trio.run(main).results}
    return np.array([by_index[i] for i in range(len(docs))])


# --- refused -------------------------------------------------------------------------------------


def _rewritten(src: str, dst, *, drop_keys=(), set_keys=None, drop_tensors=()) -> str:
    """`src` copied to `dst` without `drop_keys`/`drop_tensors`, with `set_keys` (name ->
    (GGUFWriter method, value)) written anew."""
    reader = read_gguf(src)
    set_keys = set_keys or {}
    writer = GGUFWriter(os.fspath(dst), reader.metadata["general.architecture"])
    for key, value in reader.metadata.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys:
            continue
        if key not in set_keys:
            writer.add_key_value(key, value, reader.value_types[key], _sub_type(reader, key))
    for key, (method, value) in set_keys.items():
        getattr(writer, method)(key, value)
    for tensor in reader.tensors:  # f32 and f16: stored as elements
        if tensor.name not in drop_tensors:
            writer.add_tensor(tensor.name, np.array(tensor.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return os.fspath(dst)


def _sub_type(reader, key: str):
    from gguf import GGUFValueType

    value = reader.metadata[key]
    if reader.value_types[key] != GGUFValueType.ARRAY or not value:
        return None
    return GGUFValueType.get_type(value[0])


@pytest.fixture(scope="module")
def f32_path(hf_dir, tmp_path_factory):
    return _convert(hf_dir, tmp_path_factory.mktemp("gguf-encoder") / "reranker.gguf")


@pytest.mark.parametrize(
    "change, match",
    [
        # mean pooling is an embedder's, which has no head
        (
            dict(set_keys={"bert.pooling_type": ("add_uint32", 1)}),
            r"an embedder \(MEAN\) with a head",
        ),
        (
            dict(set_keys={"bert.pooling_type": ("add_uint32", 3)}),
            r"unsupported pooling type LAST \(bert\.pooling_type\)",
        ),
        (
            dict(drop_tensors=("cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias")),
            r"no classification head.*'cls\.output\.weight'\) for RANK pooling",
        ),
        # BERT's own cross-encoder: a WordPiece vocabulary, its pooler dropped by the converter
        (
            dict(set_keys={"tokenizer.ggml.model": ("add_string", "bert")}),
            r"only XLM-RoBERTa.*'t5'.*not 'bert'",
        ),
        (dict(drop_tensors=("cls.weight",)), r"missing tensor 'cls\.weight'"),
        (dict(drop_tensors=("blk.1.ffn_up.weight",)), r"missing tensor 'blk\.1\.ffn_up\.weight'"),
        (
            dict(set_keys={"bert.context_length": ("add_uint32", 64)}),
            r"tensor 'position_embd\.weight' has shape \[128, 64\], expected \[64, 64\]",
        ),
    ],
    ids=[
        "mean-pooling",
        "last-pooling",
        "no-head",
        "bert-vocab",
        "no-dense",
        "missing-tensor",
        "positions",
    ],
)
def test_unsupported_files_are_refused(f32_path, tmp_path, change, match):
    path = _rewritten(f32_path, tmp_path / "changed.gguf", **change)
    with pytest.raises(CheckpointError, match=r"changed\.gguf: " + match):
        load_checkpoint(path, progress=False)


def test_absent_biases_load_as_zeros(f32_path, tmp_path):
    path = _rewritten(f32_path, tmp_path / "no-bias.gguf", drop_tensors=("blk.0.attn_q.bias",))
    params = load_checkpoint(path, progress=False).params
    np.testing.assert_array_equal(params["layers"]["bq"][0], 0.0)
    assert np.any(params["layers"]["bq"][1] != 0.0)


# --- embedders -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["mean", "cls"])
def test_an_embedder_file_equals_sentence_transformers(mode, tmp_path):
    from sentence_transformers import SentenceTransformer

    hf_dir = write_encoder(
        tmp_path / "embedder",
        "XLMRobertaConfig",
        FIELDS,
        "xlm-roberta",
        seed=8,
        corpus=CORPUS,
        model_max_length=MAX_LENGTH,
        vocab=300,
        perturb=0.3,
        embedder=(mode, True, None),
    )
    path = _convert(hf_dir, tmp_path / "embedder.gguf", pooling=POOLING_OF[mode])
    texts = [d for d in DOCUMENTS if d]
    config = EngineConfig(
        model=path, dtype="float32", progress=False, precompile=False, compile_cache_dir=None
    )

    async def main():
        async with open_engine(config) as engine:
            assert engine.info().head == "embedding"
            return (await engine.embed(texts, truncate=True)).embeddings

    got = trio.run(main)
    want = SentenceTransformer(str(hf_dir), device="cpu").encode(texts, convert_to_numpy=True)
    assert np.abs(got - want).max() < 1e-5


POOLING_OF = {"mean": PoolingType.MEAN, "cls": PoolingType.CLS}
