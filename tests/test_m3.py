"""BGE-M3 (`Engine.embed_hybrid`, and `embed`, `embed_sparse`, `embed_multi` on it) against
FlagEmbedding's `BGEM3FlagModel.encode` on the same directory: a tiny random XLM-RoBERTa
sentence-transformers embedder with `colbert_linear.pt` and `sparse_linear.pt` beside it, as
FlagEmbedding saves them. Dense vectors, lexical weights and multi-vectors from one forward of
each text, equal to each asked alone, packed equal to alone."""

import numpy as np
import pytest
import trio
from FlagEmbedding import BGEM3FlagModel

from bench.retrieval_models import write_m3
from engine import EngineConfig, InvalidInput, Unsupported, open_engine
from engine.capabilities import Ability
from engine.loaders.torch_pickle import read_state_dict
from tests.conftest import CORPUS, TINY_ENCODER
from tests.test_embed import varied_texts

FIELDS = dict(TINY_ENCODER, type_vocab_size=1, max_position_embeddings=130)
MAX_LENGTH = 96  # the tokenizer's model_max_length, FlagEmbedding's max_length here


@pytest.fixture(scope="module", params=[None, 48])
def m3(request, tmp_path_factory):
    """A tiny BGE-M3, its multi-vectors of the hidden width and of 48 dimensions."""
    root = tmp_path_factory.mktemp("m3")
    options = dict(seed=11, corpus=CORPUS, model_max_length=MAX_LENGTH, vocab=300)
    return write_m3(root / "m3", FIELDS, colbert_dim=request.param, **options)


def config(path) -> EngineConfig:
    return EngineConfig(
        model=str(path), dtype="float32", progress=False, precompile=False, compile_cache_dir=None
    )


def run(path, calls):
    """`calls(engine)`'s answer on an engine of `path`."""

    async def main():
        async with open_engine(config(path)) as engine:
            return await calls(engine)

    return trio.run(main)


def reference(path, texts) -> dict:
    colbert_dim = read_state_dict(path / "colbert_linear.pt")["weight"].shape[0]
    model = BGEM3FlagModel(str(path), use_fp16=False, devices="cpu", colbert_dim=colbert_dim)
    return model.encode(
        texts,
        batch_size=16,
        max_length=MAX_LENGTH,
        return_dense=True,
        return_sparse=True,
        return_colbert_vecs=True,
    )


def assert_hybrid_equal(got, want: dict) -> None:
    assert np.abs(got.dense - want["dense_vecs"]).max() < 1e-5
    for (ids, weights), lexical in zip(got.sparse, want["lexical_weights"], strict=True):
        theirs = sorted(int(k) for k in lexical)
        assert ids.tolist() == theirs
        expected = np.float32([lexical[str(k)] for k in theirs])
        assert np.abs(weights - expected).max(initial=0) <= 1e-5 * max(1.0, expected.max(initial=0))
    for vectors, colbert in zip(got.multi, want["colbert_vecs"], strict=True):
        assert vectors.shape == colbert.shape
        assert np.abs(vectors - colbert).max() < 1e-5


def test_one_pass_equals_flag_embedding(m3):
    texts = varied_texts(60, seed=5)
    got = run(m3, lambda e: e.embed_hybrid(texts, truncate=True))
    assert_hybrid_equal(got, reference(m3, texts))
    assert sum(len(ids) for ids, _ in got.sparse) > 0  # some tokens weigh above 0


def test_three_outputs_from_one_forward_equal_each_asked_alone(m3):
    texts = varied_texts(20, seed=6)

    async def calls(engine):
        before = engine.stats().real_tokens
        both = await engine.embed_hybrid(texts, truncate=True)
        one_pass = engine.stats().real_tokens - before
        dense = await engine.embed(texts, truncate=True)
        sparse = await engine.embed_sparse(texts, truncate=True)
        multi = await engine.embed_multi(texts, truncate=True)
        return both, one_pass, dense, sparse, multi

    both, one_pass, dense, sparse, multi = run(m3, calls)
    assert one_pass == both.prompt_tokens  # each text's tokens computed once for all three
    np.testing.assert_array_equal(both.dense, dense.embeddings)
    for (ids, w), (alone_ids, alone_w) in zip(both.sparse, sparse.embeddings, strict=True):
        np.testing.assert_array_equal(ids, alone_ids)
        np.testing.assert_array_equal(w, alone_w)
    for a, b in zip(both.multi, multi.embeddings, strict=True):
        np.testing.assert_array_equal(a, b)


def test_packed_equals_text_by_text(m3):
    texts = varied_texts(8, seed=7)
    packed = run(m3, lambda e: e.embed_hybrid(texts, truncate=True))
    for i, text in enumerate(texts):
        alone = run(m3, lambda e, t=text: e.embed_hybrid([t], truncate=True))
        assert np.abs(packed.dense[i] - alone.dense[0]).max() <= 1e-6
        np.testing.assert_array_equal(packed.sparse[i].indices, alone.sparse[0].indices)
        assert np.abs(packed.sparse[i].values - alone.sparse[0].values).max(initial=0) <= 1e-5
        assert np.abs(packed.multi[i] - alone.multi[0]).max() <= 1e-6


def test_subsets_and_refusals(m3):
    async def calls(engine):
        only_sparse = await engine.embed_hybrid(["a fox"], dense=False, multi=False)
        with pytest.raises(InvalidInput) as none:
            await engine.embed_hybrid(["a fox"], dense=False, sparse=False, multi=False)
        with pytest.raises(Unsupported, match="multi-vectors"):
            await engine.embed_tokens(["a fox"])
        with pytest.raises(InvalidInput) as pruned:
            await engine.embed_hybrid(["a fox"], max_active_dims=0)
        return only_sparse, none.value, pruned.value, engine.capabilities

    only_sparse, none, pruned, caps = run(m3, calls)
    assert only_sparse.dense is None and only_sparse.multi is None and only_sparse.sparse
    assert none.field == "dense" and pruned.field == "max_active_dims"
    offered = {a for a in Ability if caps.offers(a)}
    assert {
        Ability.EMBED,
        Ability.EMBED_SPARSE,
        Ability.EMBED_MULTI,
        Ability.EMBED_HYBRID,
    } <= offered
    assert Ability.SCORE not in offered and Ability.EMBED_TOKENS not in offered


def test_other_models_refuse_hybrid_outputs(minilm):
    async def calls(engine):
        for call in (engine.embed_multi, engine.embed_hybrid):
            with pytest.raises(Unsupported, match="not a multi-vector or hybrid embedder"):
                await call(["a"])

    run(minilm, calls)
