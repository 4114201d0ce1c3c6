"""Token vectors (`Engine.embed_tokens`, TEI's `/embed_all`) against sentence-transformers'
`output_value="token_embeddings"` on the same directories: the real all-MiniLM-L6-v2, the tiny
encoder embedders of every family and a tiny Qwen3-Embedding-like decoder; packed against
text by text; mixed with pooled requests in one engine; the offline model; refusals."""

from pathlib import Path

import numpy as np
import pytest
import trio
from sentence_transformers import SentenceTransformer

from engine import EngineConfig, InputTooLarge, Unsupported, load_model, open_engine
from tests.conftest import CORPUS
from tests.test_embed import EMBEDDERS, qwen3_embedding, tiny_embedder, varied_texts


@pytest.fixture(scope="module", params=sorted(EMBEDDERS))
def embedder(request, tmp_path_factory) -> Path:
    return tiny_embedder(tmp_path_factory.mktemp("embedders"), request.param)


@pytest.fixture(scope="module")
def qwen3_embedder(tmp_path_factory) -> Path:
    return qwen3_embedding(tmp_path_factory.mktemp("decoder-embedders"))


def engine_config(path, **fields) -> EngineConfig:
    return EngineConfig(
        model=str(path),
        dtype="float32",
        progress=False,
        precompile=False,
        compile_cache_dir=None,
        **fields,
    )


def embed_tokens(path, texts, **options):
    """`Engine.embed_tokens`' result."""

    async def main():
        async with open_engine(engine_config(path)) as engine:
            return await engine.embed_tokens(texts, **options)

    return trio.run(main)


def reference(path, texts, **options) -> list[np.ndarray]:
    """sentence-transformers' token vectors, f32[n, E] per text (truncated at its limit)."""
    model = SentenceTransformer(str(path), device="cpu")
    out = model.encode(
        texts, batch_size=16, output_value="token_embeddings", convert_to_numpy=False, **options
    )
    return [t.numpy() for t in out]


def max_difference(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """The largest difference of any component, after checking that the shapes agree."""
    assert [g.shape for g in got] == [w.shape for w in want]
    return max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))


def test_real_minilm_equals_sentence_transformers(minilm):
    texts = varied_texts(80)  # the 71st is over 256 tokens
    result = embed_tokens(minilm, texts, truncate=True)
    want = reference(minilm, texts)
    assert all(v.dtype == np.float32 and v.shape[1] == 384 for v in result.embeddings)
    assert max_difference(result.embeddings, want) < 1e-5
    assert result.prompt_tokens == sum(len(w) for w in want)  # every token answered, no padding
    assert result.truncated_tokens > 0  # the long texts were cut to 256 tokens, and counted


def test_tiny_embedders_equal_sentence_transformers(embedder):
    texts = varied_texts(24, seed=1)
    got = embed_tokens(embedder, texts, truncate=True).embeddings
    assert max_difference(got, reference(embedder, texts)) < 1e-5


def test_a_decoder_embedder_equals_sentence_transformers(qwen3_embedder):
    texts = varied_texts(24, seed=3)
    for options in ({}, {"prompt_name": "query"}):
        got = embed_tokens(qwen3_embedder, texts, truncate=True, **options).embeddings
        assert max_difference(got, reference(qwen3_embedder, texts, **options)) < 1e-5, options


def assert_packed_equals_text_by_text(path):
    """All texts in one request (packed together) against each in a request of its own."""
    texts = varied_texts(10, seed=2)

    async def main():
        async with open_engine(engine_config(path)) as engine:
            packed = await engine.embed_tokens(texts, truncate=True)
            alone = [await engine.embed_tokens([t], truncate=True) for t in texts]
            return packed.embeddings, [a.embeddings[0] for a in alone]

    packed, alone = trio.run(main)
    scale = max(1.0, max(float(np.abs(a).max()) for a in alone))
    assert max_difference(packed, alone) <= 1e-6 * scale


def test_packed_batches_equal_text_by_text(embedder):
    assert_packed_equals_text_by_text(embedder)


def test_a_decoders_packed_batches_equal_text_by_text(qwen3_embedder):
    assert_packed_equals_text_by_text(qwen3_embedder)


def test_a_shared_prompt_is_computed_for_every_text_and_nothing_is_read_from_the_cache(
    qwen3_embedder,
):
    """Token vectors of texts that share a prompt (which pooled vectors compute once and cache)
    cover every prompt token of every text, in an engine whose KV cache holds that prompt."""
    texts = [t for t in varied_texts(24, seed=4) if t.strip()][:12]
    options = dict(prompt_name="query", truncate=True)

    async def main():
        async with open_engine(engine_config(qwen3_embedder)) as engine:
            pooled = await engine.embed(texts, **options)  # the prompt now cached
            saved = engine.stats().prefix_tokens_saved
            tokens = await engine.embed_tokens(texts, **options)
            shared = engine.stats().prefix_tokens_saved - saved
            again = await engine.embed(texts, **options)
            return pooled, tokens, shared, again

    pooled, tokens, shared, again = trio.run(main)
    want = reference(qwen3_embedder, texts, prompt_name="query")
    assert max_difference(tokens.embeddings, want) < 1e-5
    assert shared == 0  # the token request shared no prompt
    assert again.cached_tokens > 0  # and the cache still holds it for pooled requests
    np.testing.assert_allclose(again.embeddings, pooled.embeddings, atol=1e-6)


def test_concurrent_pooled_and_token_requests_each_get_their_own_answer(minilm):
    """Pooled and token requests queued together run in batches of their own kind: each
    answer equals the one its request gets alone."""
    texts = varied_texts(16, seed=4)

    async def main():
        async with open_engine(engine_config(minilm)) as engine:
            answers = {}

            async def run(name, call):
                answers[name] = await call

            async with trio.open_nursery() as nursery:
                for i in range(4):
                    part = texts[i * 4 : (i + 1) * 4]
                    nursery.start_soon(run, ("tokens", i), engine.embed_tokens(part, truncate=True))
                    nursery.start_soon(run, ("pooled", i), engine.embed(part, truncate=True))
            return answers

    answers = trio.run(main)
    tokens = embed_tokens(minilm, texts, truncate=True).embeddings
    pooled = load_model(minilm, dtype="float32", progress=False).embed(texts, truncate=True)
    scale = max(float(np.abs(t).max()) for t in tokens)  # f32 sums in another batch's order
    for i in range(4):
        part = slice(i * 4, (i + 1) * 4)
        assert max_difference(answers["tokens", i].embeddings, tokens[part]) <= 1e-6 * scale
        np.testing.assert_allclose(answers["pooled", i].embeddings, pooled[part], atol=1e-6)


def test_the_offline_model_answers_as_the_engine(minilm):
    texts = varied_texts(12, seed=5)
    model = load_model(minilm, dtype="float32", progress=False)
    offline = model.embed_tokens(texts, truncate=True)
    engine = embed_tokens(minilm, texts, truncate=True).embeddings
    assert max_difference(offline, engine) == 0.0
    with pytest.raises(InputTooLarge, match=r"^input\[0\]: \d+ tokens exceed"):
        model.embed_tokens([" ".join(CORPUS[:6]) * 8])


def test_a_scorer_refuses_token_vectors(tiny_path):
    async def main():
        async with open_engine(engine_config(tiny_path)) as engine:
            with pytest.raises(Unsupported, match="not an embedder"):
                await engine.embed_tokens(["a"])

    trio.run(main)


def test_a_request_for_more_token_vectors_than_allowed_is_refused(minilm):
    texts = ["A kitten sleeps in the sun.", "Stocks fell."]  # 9 and 5 tokens with [CLS], [SEP]
    config = engine_config(minilm, max_token_vectors_per_request=13)

    async def main():
        async with open_engine(config) as engine:
            with pytest.raises(InputTooLarge, match=r"^input: 14 tokens' vectors exceed the limit"):
                await engine.embed_tokens(texts)
            alone = await engine.embed_tokens(texts[:1])  # within it
            pooled = await engine.embed(texts)  # pooled vectors are not bound by it
            return alone, pooled

    alone, pooled = trio.run(main)
    assert [len(v) for v in alone.embeddings] == [9] and pooled.embeddings.shape == (2, 384)
