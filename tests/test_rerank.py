"""The one rerank path: `load_model().rerank` and `Engine.rerank` give the same relevances under
every cutting option (`max_tokens_per_doc`, `truncate`, `max_prompt_tokens`,
`truncation_side`), for a decoder's recipe and a cross-encoder's pairs, and the options change
what is scored."""

import numpy as np
import pytest
import trio

from bench.encoders import write_encoder
from engine import InvalidInput, Unsupported, load_model, open_engine
from engine.capabilities import capabilities_of
from tests.conftest import CORPUS, TINY_ENCODER
from tests.test_api_support import tiny_config

QUERY = "Where does the quick fox go?"
DOCS = [CORPUS[0] * 3, CORPUS[1], " ".join(CORPUS[2:5]) * 2, CORPUS[5]]
OPTIONS = [
    dict(max_tokens_per_doc=6),
    dict(max_tokens_per_doc=6, truncation_side="left"),
    dict(truncate=True),
    dict(max_prompt_tokens=60),
    dict(max_prompt_tokens=60, truncation_side="left", raw_scores=True),
]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    path = tmp_path_factory.mktemp("rerank") / "bert"
    fields = dict(TINY_ENCODER, type_vocab_size=2)
    write_encoder(path, "BertConfig", fields, "bert", seed=5, corpus=CORPUS,
                  model_max_length=96, vocab=300, perturb=0.3)  # fmt: skip
    return path


@pytest.fixture(scope="module", params=["decoder", "cross-encoder"])
def model_path(request, tiny_path, cross_encoder):
    return tiny_path if request.param == "decoder" else cross_encoder


def engine_relevances(path, cases) -> list[list[float]]:
    async def main():
        async with open_engine(tiny_config(path)) as engine:
            out = []
            for options in cases:
                result = await engine.rerank(QUERY, DOCS, **options)
                by_index = {h.index: h.relevance_score for h in result.results}
                out.append([by_index[i] for i in range(len(DOCS))])
            return out

    return trio.run(main)


def test_offline_rerank_honours_every_option_as_the_engine_does(model_path):
    model = load_model(str(model_path), dtype="float32", progress=False)
    offline = [model.rerank(QUERY, DOCS, **options) for options in [{}, *OPTIONS]]
    engine = engine_relevances(model_path, [{}, *OPTIONS])
    np.testing.assert_allclose(offline, engine, rtol=1e-5, atol=1e-6)
    whole, right, left = offline[0], offline[1], offline[2]
    assert not np.allclose(right, whole, atol=1e-4)  # the cut changed what was scored
    assert not np.allclose(left, right, atol=1e-4)  # ... and which end it kept


def test_offline_rerank_refuses_bad_options_as_the_engine_does(tiny_path):
    model = load_model(str(tiny_path), dtype="float32", progress=False)
    cases = [
        (dict(max_tokens_per_doc=0), "max_tokens_per_doc"),
        (dict(truncation_side="middle"), "truncation_side"),
        (dict(max_prompt_tokens=10**6), "max_prompt_tokens"),
    ]
    for options, field in cases:
        with pytest.raises(InvalidInput, match=f"^{field}"):
            model.rerank(QUERY, DOCS, **options)
    with pytest.raises(InvalidInput, match=r"^documents"):
        model.rerank(QUERY, "one string")
    assert model.rerank(QUERY, []) == []  # nothing to rank


def test_a_model_whose_recipe_labels_are_not_tokens_cannot_rerank(tiny_path):
    model = load_model(str(tiny_path), dtype="float32", progress=False)
    model.engine.capabilities = capabilities_of(model.task, "its yes/no are not single tokens")
    with pytest.raises(Unsupported, match="rerank is unavailable"):
        model.rerank(QUERY, DOCS)
