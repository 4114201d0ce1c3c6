"""The capability record (`engine.capabilities`): what each kind of model offers, asked one way,
and every refusal in the same words from `Engine`, from `load_model()` and over HTTP."""

import pytest
import trio

from api.app import create_app
from api.routes import ENDPOINTS, scoring_endpoints
from api.settings import settings_from_env
from bench.colbert_models import write_colbert
from bench.encoders import write_encoder
from bench.retrieval_models import write_m3, write_splade
from engine import InvalidInput, Unsupported, load_model, open_engine
from engine.capabilities import VERBS, Ability, capabilities_of
from engine.loaders import load_checkpoint
from tests.conftest import CORPUS, TINY_ENCODER, write_tiny_checkpoint
from tests.test_api_support import serving, tiny_config, tiny_env

QUERY, TEXTS = "Where does the fox jump?", ["The quick brown fox jumps.", "Numbers 0 1 2"]
OFFERS = {  # the verbs each kind serves
    "language-model": {Ability.SCORE, Ability.RERANK},
    "classifier": {Ability.RERANK},
    "cross-encoder": {Ability.RERANK},
    "embedder": {Ability.EMBED, Ability.EMBED_TOKENS, Ability.RERANK},  # by cosine
    "sparse encoder": {Ability.EMBED_SPARSE},
    "hybrid embedder": {
        Ability.EMBED,
        Ability.EMBED_SPARSE,
        Ability.EMBED_MULTI,
        Ability.EMBED_HYBRID,
        Ability.RERANK,
    },
    "late-interaction model": {Ability.EMBED_MULTI, Ability.RERANK},
}
# each verb's Python call (on an `Engine` or a `ScoringModel`) and its HTTP request (None: no
# route of its own)
CALLS = {
    Ability.SCORE: (lambda m: m.score(QUERY, TEXTS, [1]), "/v1/score"),
    Ability.RERANK: (lambda m: m.rerank(QUERY, TEXTS), "/v1/rerank"),
    Ability.EMBED: (lambda m: m.embed(TEXTS), "/v1/embeddings"),
    Ability.EMBED_TOKENS: (lambda m: m.embed_tokens(TEXTS), "/embed_all"),
    Ability.EMBED_SPARSE: (lambda m: m.embed_sparse(TEXTS), "/embed_sparse"),
    Ability.EMBED_MULTI: (lambda m: m.embed_multi(TEXTS), None),
    Ability.EMBED_HYBRID: (lambda m: m.embed_hybrid(TEXTS), "/embed_hybrid"),
}
BODIES = {
    "/v1/score": {"query": QUERY, "items": TEXTS, "label_token_ids": [1]},
    "/v1/rerank": {"query": QUERY, "documents": TEXTS},
    "/v1/embeddings": {"input": TEXTS},
    "/embed_all": {"inputs": TEXTS},
    "/embed_sparse": {"inputs": TEXTS},
    "/embed_hybrid": {"inputs": TEXTS},
}


@pytest.fixture(scope="module", params=sorted(OFFERS))
def model(request, tiny_checkpoints, minilm, tmp_path_factory):
    """(kind, path) of a model of each kind."""
    kind, root = request.param, tmp_path_factory.mktemp("kinds")
    if kind == "language-model":
        return kind, tiny_checkpoints["llama-untied"]
    if kind == "classifier":
        auto = "AutoModelForSequenceClassification"
        return kind, write_tiny_checkpoint(root, "qwen3", auto, num_labels=1)
    if kind == "cross-encoder":
        fields = dict(TINY_ENCODER, type_vocab_size=2)
        options = dict(seed=1, corpus=CORPUS, model_max_length=96, vocab=300, perturb=0.3)
        return kind, write_encoder(root / "bert", "BertConfig", fields, "bert", **options)
    if kind == "sparse encoder":
        fields = dict(TINY_ENCODER, type_vocab_size=2)
        options = dict(seed=1, corpus=CORPUS, model_max_length=96, vocab=300)
        return kind, write_splade(root / "splade", "BertConfig", fields, "bert", **options)
    if kind == "hybrid embedder":
        fields = dict(TINY_ENCODER, type_vocab_size=1, max_position_embeddings=130)
        options = dict(seed=1, corpus=CORPUS, model_max_length=96, vocab=300)
        return kind, write_m3(root / "m3", fields, **options)
    if kind == "late-interaction model":
        return kind, write_colbert(root / "colbert", seed=1)
    return kind, minilm


def refusal_of(call) -> str:
    """The words of the error `call()` raises for a verb the model refuses."""
    with pytest.raises((InvalidInput, Unsupported)) as error:
        call()
    return str(error.value)


def test_each_kind_offers_its_verbs_and_refuses_the_rest_in_the_same_words(model):
    kind, path = model

    async def engine_side():
        async with open_engine(tiny_config(path)) as engine:
            caps = engine.capabilities
            assert {v for v in VERBS if caps.offers(v)} == OFFERS[kind]
            assert engine.task.name == kind
            assert engine.info().capabilities == {a.value: caps.refusal(a) for a in Ability}
            words = {}
            for verb in set(VERBS) - OFFERS[kind]:
                call, _ = CALLS[verb]
                with pytest.raises((InvalidInput, Unsupported)) as error:
                    await call(engine)
                assert caps.refusal(verb) in str(error.value)
                words[verb] = str(error.value)
            return words, scoring_endpoints(engine)

    words, endpoints = trio.run(engine_side)
    offered = [e.path for e in ENDPOINTS if set(e.needs) & OFFERS[kind]]
    assert endpoints == offered and offered
    with load_model(path, dtype="float32", progress=False) as sync:
        for verb, said in words.items():
            assert refusal_of(lambda verb=verb: CALLS[verb][0](sync)) == said
    app = create_app(settings_from_env(tiny_env(path)))
    for client in serving(app, "asyncio"):
        assert client.get("/v1/models").json()["data"][0]["endpoints"] == endpoints
        for verb, said in words.items():
            route = CALLS[verb][1]
            if route is None:
                continue
            r = client.post(route, json=BODIES[route])
            error = r.json()["error"]
            message = error if isinstance(error, str) else error["message"]  # TEI's, ours
            tei = isinstance(error, str)  # TEI's answer for a model not of the route's kind
            assert r.status_code == (424 if tei else 400) and message == said, (verb, r.text)


def test_the_record_is_the_tasks_refusals_and_the_recipes_labels(tiny_checkpoints, minilm):
    lm = load_checkpoint(str(tiny_checkpoints["llama-untied"]), progress=False).task
    record = capabilities_of(lm, "'yes' / 'no' are not single tokens")
    assert record.refusal(Ability.RERANK) == "'yes' / 'no' are not single tokens"
    assert record.verbs() == ["score"] and record.offers(Ability.RECIPE)
    with pytest.raises(Unsupported, match=r"^rerank is unavailable for this model: 'yes' / 'no'"):
        record.require(Ability.RERANK)
    with pytest.raises(Unsupported, match=r"^embed is unavailable .* \(llama\), not an embedder"):
        record.require(Ability.EMBED)
    embedder = load_checkpoint(str(minilm), progress=False).task
    record = capabilities_of(embedder, embedder.rerank_labels(None, None))
    assert record.verbs() == ["rerank", "embed", "embed_tokens"]
    with pytest.raises(InvalidInput, match=r"^reranker: this model is an embedder \(bert emb"):
        record.require(Ability.RECIPE)  # not "a cross-encoder"
    with pytest.raises(InvalidInput, match=r"^label_token_ids: this model is an embedder"):
        record.require(Ability.SCORE)
