"""Cross-encoders (BERT, XLM-RoBERTa, ModernBERT) against transformers and sentence-transformers'
CrossEncoder on tiny random checkpoints saved as real Hugging Face directories: scores, pair
tokenisation and truncation, packed batches against pair-by-pair scoring, and the service."""

import numpy as np
import pytest
import torch
import transformers
import trio
from sentence_transformers import CrossEncoder

from api.app import create_app
from api.routes import RERANK_PATHS
from api.settings import settings_from_env
from bench.encoders import write_encoder
from engine import EngineConfig, InvalidInput, load_model, open_engine
from engine.host.pairs import PairEncoder, PairOptions
from engine.kinds import Layout
from engine.loaders import load_checkpoint
from engine.models.rows import HEAD_ROWS
from score_kernels import cpu
from tests.conftest import CORPUS, TINY_ENCODER
from tests.test_api_support import serving, tiny_env

MAX_LENGTH = 96  # the tokenizers' model_max_length: long pairs are truncated to it
TINY = TINY_ENCODER
ENCODERS = {
    # name: (config class, fields, tokenizer kind)
    "bert": ("BertConfig", dict(TINY, type_vocab_size=2), "bert"),
    "bert-3labels": ("BertConfig", dict(TINY, type_vocab_size=2, num_labels=3), "bert"),
    "xlm-roberta": (
        "XLMRobertaConfig",
        dict(TINY, type_vocab_size=1, max_position_embeddings=130),
        "xlm-roberta",
    ),
    # windows of 16 (keys within 8 on either side): the pairs are far longer
    "modernbert": (
        "ModernBertConfig",
        dict(TINY, num_hidden_layers=3, local_attention=16, global_attn_every_n_layers=2),
        "modernbert",
    ),
    "modernbert-mean": (
        "ModernBertConfig",
        dict(TINY, local_attention=16, global_attn_every_n_layers=2, classifier_pooling="mean"),
        "modernbert",
    ),
}
QUERY = "Is this document relevant to the query?"
BF16 = {"dtype": "bfloat16"}
LONG = "The quick brown fox jumps over the lazy dog near the river bank. " * 12


def documents() -> list[str]:
    """Varied documents: short, empty-ish, unicode, code, and longer than the max length."""
    return [*CORPUS[:6], "x", LONG, CORPUS[4] * 5, " ".join(CORPUS[:3]) * 2]


@pytest.fixture(scope="module", params=sorted(ENCODERS))
def encoder(request, tmp_path_factory):
    cls, fields, kind = ENCODERS[request.param]
    path = tmp_path_factory.mktemp("encoders") / request.param
    seed = sum(map(ord, request.param))
    write_encoder(
        path,
        cls,
        fields,
        kind,
        seed=seed,
        corpus=CORPUS,
        model_max_length=MAX_LENGTH,
        vocab=300,
        perturb=0.3,
    )
    return path


def config(path, **overrides) -> EngineConfig:
    fields = dict(model=str(path), dtype="float32", progress=False, precompile=False)
    return EngineConfig(**{**fields, "compile_cache_dir": None, **overrides})


def rerank(path, query, docs, **options):
    """Each document's relevance in document order, and the result."""

    async def main():
        async with open_engine(config(path, **options.pop("engine", {}))) as engine:
            return await engine.rerank(query, docs, **options)

    result = trio.run(main)
    by_index = {h.index: h.relevance_score for h in result.results}
    return np.array([by_index[i] for i in range(len(docs))]), result


def hf_logits(path, query: str, docs: list[str], max_length: int = MAX_LENGTH) -> np.ndarray:
    """transformers' `*ForSequenceClassification` logits f32[N, labels], tokenised as
    CrossEncoder does (truncated to `max_length`)."""
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    batch = tok(
        [query] * len(docs),
        docs,
        padding=True,
        truncation="longest_first",
        max_length=max_length,
        return_tensors="pt",
    )
    with torch.no_grad():
        return model(**batch).logits.numpy()


def test_scores_equal_transformers_and_cross_encoder(encoder):
    docs = documents()
    raw, result = rerank(encoder, QUERY, docs, raw_scores=True)
    scores, _ = rerank(encoder, QUERY, docs)
    logits = hf_logits(encoder, QUERY, docs)  # [N, labels]
    np.testing.assert_allclose(raw, logits[:, -1], atol=1e-5)
    ce = CrossEncoder(str(encoder), device="cpu")
    assert ce.max_seq_length == MAX_LENGTH
    predicted = np.asarray(ce.predict([(QUERY, d) for d in docs], batch_size=4))
    if logits.shape[1] == 1:  # CrossEncoder's default: the sigmoid of the one logit
        np.testing.assert_allclose(scores, predicted, atol=1e-6)
    else:  # its logits; ours: the softmax's last label
        np.testing.assert_allclose(predicted, logits, atol=1e-5)
        softmax = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        np.testing.assert_allclose(scores, softmax[:, -1], atol=1e-6)
    assert result.truncated_tokens > 0  # the long documents were cut
    offline = load_model(encoder, dtype="float32", progress=False)
    np.testing.assert_allclose(offline.rerank(QUERY, docs), scores, atol=1e-6)
    np.testing.assert_allclose(offline.rerank(QUERY, docs, raw_scores=True), raw, atol=1e-6)
    with pytest.raises(InvalidInput, match=r"^label_token_ids: this model has"):
        offline.score(QUERY, docs, [1])


def test_more_pairs_than_one_step_of_rows_equal_transformers(encoder):
    """A batch of more pairs than `HEAD_ROWS`: the rows past the last layer's attention run in
    steps, each pair's logits as transformers gives them."""
    docs = [f"{CORPUS[i % 6]} {i}" for i in range(3 * HEAD_ROWS)]  # batches of 128+ pairs
    raw, _ = rerank(encoder, QUERY, docs, raw_scores=True)
    np.testing.assert_allclose(raw, hf_logits(encoder, QUERY, docs)[:, -1], atol=1e-5)


@pytest.mark.parametrize("side", ["right", "left"])
def test_pairs_tokenise_and_truncate_as_transformers(encoder, side):
    checkpoint = load_checkpoint(encoder, progress=False)
    cfg = checkpoint.config
    pairs = PairEncoder(
        checkpoint.tokenizer, vocab_size=cfg.vocab_size, type_vocab_size=cfg.type_vocab_size
    )
    tok = transformers.AutoTokenizer.from_pretrained(encoder, truncation_side=side)
    queries = [QUERY, LONG, "", "a"]  # a query longer than the limit too
    for query in queries:
        docs = documents()
        got = pairs.encode(query, docs, PairOptions(limit=cfg.max_length, side=side))
        want = tok([query] * len(docs), docs, truncation="longest_first", max_length=MAX_LENGTH)
        full = tok([query] * len(docs), docs)
        types = want.get("token_type_ids") if cfg.type_vocab_size > 1 else None
        for i, seq in enumerate(got.sequences):
            ids = [t % cfg.vocab_size for t in seq]
            assert ids == want["input_ids"][i]
            if types is not None:
                assert [t // cfg.vocab_size for t in seq] == types[i]
        lengths = zip(full["input_ids"], want["input_ids"], strict=True)
        cut = sum(len(f) - len(w) for f, w in lengths)
        assert got.truncated == cut


def test_packed_batches_equal_pair_by_pair(encoder):
    rng = np.random.default_rng(3)
    words = " ".join(CORPUS).split()
    docs = [" ".join(rng.choice(words, int(rng.integers(1, 60)))) for _ in range(64)]
    # a small budget: several batches, bucket padding, pairs of 5-96 tokens side by side

    async def main():
        async with open_engine(config(encoder, token_budget=512, block_size=32)) as engine:
            together = await engine.rerank(QUERY, docs, raw_scores=True)
            alone = [
                (await engine.rerank(QUERY, [d], raw_scores=True)).results[0].relevance_score
                for d in docs[:16]
            ]
            return together, alone, engine.stats()

    together, alone, stats = trio.run(main)
    got = {h.index: h.relevance_score for h in together.results}
    np.testing.assert_allclose([got[i] for i in range(16)], alone, atol=1e-5)
    assert stats.batches >= 16 + 3  # the 64 pairs took several batches
    np.testing.assert_allclose(
        [got[i] for i in range(64)], hf_logits(encoder, QUERY, docs)[:, -1], atol=1e-5
    )


@pytest.mark.parametrize("attention", ["reference", "cpu", "pallas"])
def test_attention_implementations_agree(encoder, attention):
    from score_kernels import ATTENTION

    if attention not in ATTENTION:
        pytest.skip("the native CPU kernel was not built")
    docs = documents()[:6]
    want, _ = rerank(encoder, QUERY, docs, raw_scores=True, engine={"attention": "xla"})
    got, _ = rerank(encoder, QUERY, docs, raw_scores=True, engine={"attention": attention})
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_bfloat16_stays_near_float32(encoder):
    docs = documents()
    f32, _ = rerank(encoder, QUERY, docs, raw_scores=True)
    bf16, _ = rerank(encoder, QUERY, docs, raw_scores=True, engine={"dtype": "bfloat16"})
    assert np.abs(bf16 - f32).max() < 0.05 * max(1.0, np.abs(f32).max())


@pytest.mark.skipif(not cpu.DENSE_AVAILABLE, reason="needs the native bf16 kernel")
def test_the_fused_projections_equal_the_plain_ones(encoder):
    """In bf16 the native kernel adds the up projection's bias and applies the activation
    itself (ModernBERT's gated MLP excepted), and writes q, k and v with their biases straight
    into their heads (RoPE models excepted): the scores equal XLA's plain products, split,
    activation and rounding but for bf16 roundings of last f32 bits."""
    docs = documents()
    fused, _ = rerank(encoder, QUERY, docs, raw_scores=True, engine=BF16 | {"dense": "cpu"})
    plain, _ = rerank(encoder, QUERY, docs, raw_scores=True, engine=BF16 | {"dense": "xla"})
    assert np.abs(fused - plain).max() < 0.02 * max(1.0, np.abs(plain).max())


def test_prompt_limit_and_document_limit(encoder):
    docs = documents()

    async def main():
        async with open_engine(config(encoder)) as engine:
            short = await engine.rerank(QUERY, docs, raw_scores=True, max_prompt_tokens=40)
            cut = await engine.rerank(QUERY, docs, raw_scores=True, max_tokens_per_doc=12)
            with pytest.raises(InvalidInput, match=r"^max_prompt_tokens: a pair needs at least"):
                await engine.rerank(QUERY, docs, max_prompt_tokens=2)
            return short, cut

    short, cut = trio.run(main)
    scores = lambda r: [
        {h.index: h.relevance_score for h in r.results}[i] for i in range(len(docs))
    ]
    np.testing.assert_allclose(
        scores(short), hf_logits(encoder, QUERY, docs, max_length=40)[:, -1], atol=1e-5
    )
    assert short.prompt_tokens <= 40 * len(docs) and short.truncated_tokens > 0
    # each document's own token ids cut to their first 12 (counted), then paired: nothing
    # left for the pair's own truncation
    tok = load_checkpoint(encoder, progress=False).tokenizer
    own = [len(tok.encode(d, add_special_tokens=False).ids) for d in docs]
    assert cut.truncated_tokens == sum(max(0, n - 12) for n in own) > 0
    pair = len(tok.encode(QUERY, "x").ids) - len(tok.encode("x", add_special_tokens=False).ids)
    assert cut.prompt_tokens == sum(pair + min(n, 12) for n in own)


def test_the_service_reranks_as_the_engine_and_refuses_label_scores(encoder):
    docs = documents()[4:9]  # one longer than the max length
    want, result = rerank(encoder, QUERY, docs, raw_scores=True)
    assert result.truncated_tokens > 0
    app = create_app(settings_from_env(tiny_env(encoder)))
    for client in serving(app, "asyncio"):
        info = client.get("/get_model_info").json()
        assert info["architecture"] == "cross-encoder"
        assert info["rerank_template"] == "cross-encoder"
        assert info["head"] == "sequence-classification"
        assert info["endpoints"] == [*RERANK_PATHS, "/invocations", "/"]  # no /v1/score
        card = client.get("/v1/models").json()["data"][0]
        assert (card["architecture"], card["family"]) == ("cross-encoder", info["family"])
        body = {"query": QUERY, "documents": docs, "return_documents": False}
        r = client.post("/v1/rerank", json=body)
        assert r.status_code == 200, r.text
        got = {h["index"]: h["relevance_score"] for h in r.json()["results"]}
        scores, _ = rerank(encoder, QUERY, docs)
        np.testing.assert_allclose([got[i] for i in range(5)], scores, atol=1e-6)
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] == result.prompt_tokens
        assert usage["prompt_tokens_details"]["truncated_tokens"] == result.truncated_tokens
        r = client.post("/rerank", json={"query": QUERY, "texts": docs, "raw_scores": True})
        assert r.status_code == 200, r.text
        got = {h["index"]: h["score"] for h in r.json()}
        np.testing.assert_allclose([got[i] for i in range(5)], want, atol=1e-6)
        r = client.post("/v1/score", json={"query": QUERY, "items": docs, "label_token_ids": [1]})
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["param"] == "label_token_ids" and "cross-encoder" in error["message"]
        r = client.post("/v1/rerank", json={"query": QUERY, "documents": []})
        assert r.status_code == 400 and r.json()["error"]["param"] == "documents"
        r = client.post("/score", json={"queries": QUERY, "documents": docs})  # vLLM's
        assert r.status_code == 200, r.text
        got = {d["index"]: d["score"] for d in r.json()["data"]}
        np.testing.assert_allclose([got[i] for i in range(5)], scores, atol=1e-6)
        server = client.get("/get_server_info").json()
        assert server["plan"]["cpu"]["weight_bytes"] > 0
        r = client.get("/get_server_info?roofline=1")
        assert r.status_code == 400 and "cross-encoder" in r.json()["error"]["message"]
        assert client.get("/info").json()["auto_truncate"] is True  # TEI's: pairs are cut


def test_a_rerank_recipe_is_refused_for_a_cross_encoder(encoder):
    async def main():
        async with open_engine(config(encoder, reranker="qwen3-reranker")):
            pass

    with pytest.raises(InvalidInput, match=r"^reranker: this is a cross-encoder"):
        trio.run(main)


def test_an_encoder_without_a_classification_head_is_refused(tmp_path):
    import json

    from engine.loaders import CheckpointError

    cls, fields, kind = ENCODERS["bert"]
    path = write_encoder(
        tmp_path / "bert",
        cls,
        fields,
        kind,
        seed=1,
        corpus=CORPUS,
        model_max_length=MAX_LENGTH,
        vocab=300,
    )
    hf = json.loads((path / "config.json").read_text())
    hf["architectures"] = ["BertModel"]
    (path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match=r"a sentence-transformers embedder .* none of them"):
        load_checkpoint(path, progress=False)


def test_packing_lays_each_pair_alone_and_scores_its_first_token():
    from engine.host.buckets import make_buckets
    from engine.host.packing import pack
    from engine.host.planning import plan

    seqs = [[5, 6, 7], [5, 6, 8, 9], [5, 6, 7]]  # shared prefixes: still laid out alone
    buckets = make_buckets(128, token_budget=64, block_size=16)
    (chunks,) = plan(seqs, token_budget=64, buckets=buckets, layout=Layout.WHOLE)
    batch = pack(seqs, [[0]] * 3, chunks, buckets, layout=Layout.WHOLE)
    meta, inputs = batch.inputs.meta, batch.inputs
    assert batch.real_tokens == 10
    assert inputs.score_rows[:3].tolist() == [0, 3, 7]  # each pair's first token
    assert meta.own_start[:10].tolist() == [0, 0, 0, 3, 3, 3, 3, 7, 7, 7]
    assert meta.own_end[:10].tolist() == [3, 3, 3, 7, 7, 7, 7, 10, 10, 10]
    assert (meta.prefix_end == meta.prefix_start).all()
    t = meta.own_end.shape[0]
    assert meta.own_end[10:].tolist() == list(range(11, t + 1))  # padding sees itself
    assert inputs.positions[:10].tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2]
