"""The task of each kind of checkpoint: chosen from the config, and what it decides (relevance
formulas, refusals, pairs, KV reuse, the forward it assembles)."""

import jax
import msgspec
import numpy as np
import pytest

from engine.capabilities import Ability
from engine.kinds import Layout, Output
from engine.models import ModelConfig, decoder, encoder
from engine.models.config import Pooling
from engine.rerank import RerankOptions
from engine.tasks import HEADS, Classifier, Decoder, Encoder, LabelScores, Pooler, task_for
from engine.tasks.base import exactly
from tests.conftest import tiny_tokenizer

BASE = ModelConfig(
    family="llama",
    vocab_size=300,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)
CLASSIFIER = msgspec.structs.replace(BASE, num_labels=2)
ENCODER = msgspec.structs.replace(
    BASE, family="bert", encoder=True, num_labels=1, type_vocab_size=2, max_length=96
)


EMBEDDER = msgspec.structs.replace(ENCODER, num_labels=0, embedding=Pooling(mode="cls"))
DECODER_EMBEDDER = msgspec.structs.replace(BASE, embedding=Pooling(mode="last"))


@pytest.mark.parametrize(
    "config, backbone, head, name",
    [
        (BASE, Decoder, LabelScores, "language-model"),
        (CLASSIFIER, Decoder, Classifier, "classifier"),
        (ENCODER, Encoder, Classifier, "cross-encoder"),
        (EMBEDDER, Encoder, Pooler, "embedder"),
        (DECODER_EMBEDDER, Decoder, Pooler, "embedder"),
    ],
)
def test_each_config_gets_one_backbone_and_exactly_one_head(config, backbone, head, name):
    task = task_for(config)
    assert (type(task.backbone), type(task.head), task.name) == (backbone, head, name)
    assert [h for h in HEADS if h.fits(config)] == [head]  # whatever the order of HEADS


def test_what_each_kind_decides():
    lm, cls, enc = task_for(BASE), task_for(CLASSIFIER), task_for(ENCODER)
    assert lm.refusal(Ability.SCORE) is None
    assert "sequence-classification head of 2 label(s)," in cls.refusal(Ability.SCORE)
    assert "(a bert cross-encoder)" in enc.refusal(Ability.SCORE)
    assert (lm.reuses_kv, cls.reuses_kv, enc.reuses_kv) == (True, True, False)
    assert (lm.layout(Output.LOGPROBS), enc.layout(Output.LOGITS)) == (Layout.SHARED, Layout.WHOLE)
    assert lm.refusal(Ability.RECIPE) is None and "no recipe" in enc.refusal(Ability.RECIPE)
    assert lm.refusal(Ability.TENSOR_PARALLEL) is None
    assert "data_parallel" in enc.refusal(Ability.TENSOR_PARALLEL)
    assert lm.refusal(Ability.ROOFLINE) is None
    assert "cross-encoder" in enc.refusal(Ability.ROOFLINE)
    assert lm.pair_encoder(tiny_tokenizer()) is None
    assert enc.pair_encoder(tiny_tokenizer()).id_space == 600  # two token types, coded
    assert cls.rerank_labels(None, None).ids == [0, 1]
    kinds = (lm.head.kind, cls.head.kind, enc.head.kind)
    assert kinds == ("language-model",) + ("sequence-classification",) * 2
    assert (lm.architecture, cls.architecture, enc.architecture) == (
        "decoder",
        "decoder",
        "cross-encoder",
    )
    assert (lm.describe(), enc.describe()) == ("llama", "bert cross-encoder")


def test_the_forward_is_the_kinds_model_bound_to_its_config():
    lm, enc = task_for(BASE), task_for(ENCODER)
    forward = lm.forward_of("attention", "dense", unroll=True)
    assert forward.func is decoder.forward
    assert forward.keywords["output"] is decoder.label_logprobs
    assert task_for(CLASSIFIER).forward_of("a", "d").keywords["output"] is decoder.class_logits
    assert forward.keywords["cfg"] is BASE and forward.keywords["unroll"] is True
    assert forward.keywords["family"].name == "llama"
    assert enc.forward_of("attention", "dense").func is encoder.forward
    assert enc.forward_of("attention", "dense").keywords["output"] is encoder.pair_logits
    fewer = msgspec.structs.replace(BASE, num_layers=1)
    assert lm.forward_of("a", "d", config=fewer).keywords["cfg"] is fewer


def test_an_exact_forward_traces_every_dot_at_highest_precision():
    precision = lambda *args, **kwargs: jax.config.jax_default_matmul_precision
    assert exactly(precision)() == "highest"
    assert precision() is None  # only while the forward is traced
    exact = task_for(BASE).forward_of("a", "d", exact=True)
    assert exact.__wrapped__.func is decoder.forward  # the same forward, traced exactly
    x = jax.numpy.ones((2, 2), jax.numpy.float32)
    text = jax.jit(exactly(lambda a: a @ a)).lower(x).as_text()
    assert "precision = [HIGHEST, HIGHEST]" in text
    assert "HIGHEST" not in jax.jit(lambda a: a @ a).lower(x).as_text()


def test_cross_encoder_pairs_are_cut_to_the_shorter_limit():
    enc = task_for(ENCODER)
    cut = lambda fit, side="right", per_doc=None: RerankOptions(None, per_doc, fit, side)
    query, items, pairs, _ = enc.rerank_inputs(None, None, "q", ("a", "b"), cut(None, "left"))
    assert (query, items, pairs.limit, pairs.side) == ("q", ["a", "b"], 96, "left")
    assert enc.rerank_inputs(None, None, "q", ["a"], cut(40))[2].limit == 40
    assert enc.rerank_inputs(None, None, "q", ["a"], cut(500))[2].limit == 96
    assert enc.rerank_inputs(None, None, "q", ["a"], cut(None, per_doc=7))[2].item_limit == 7


def test_relevance_formulas():
    lm, one, two = task_for(BASE), task_for(ENCODER), task_for(CLASSIFIER)
    lp = np.log(np.array([[0.2, 0.6], [0.5, 0.1]]))
    np.testing.assert_allclose(lm.relevance(lp, raw=False), [0.25, 5 / 6])
    np.testing.assert_allclose(lm.relevance(lp, raw=True), np.log([1 / 3, 5]))
    logit = np.array([[0.0], [2.0]])
    np.testing.assert_allclose(one.relevance(logit, raw=False), [0.5, 1 / (1 + np.e**-2)])
    np.testing.assert_allclose(one.relevance(logit, raw=True), [0.0, 2.0])
    pair = np.array([[0.0, np.log(3.0)]])
    np.testing.assert_allclose(two.relevance(pair, raw=False), [0.75])
    np.testing.assert_allclose(two.relevance(pair, raw=True), [np.log(3.0)])


def test_only_embedders_answer_token_states():
    mean = msgspec.structs.replace(BASE, embedding=Pooling(mode="mean"))
    states = task_for(mean).forward_of("a", "d", output=Output.TOKENS)
    assert states.keywords["rows"] is decoder.every_token  # not the mean its vectors take
    assert states.keywords["output"] is decoder.last_hidden
    encoder_states = task_for(msgspec.structs.replace(ENCODER, embedding=Pooling(mode="cls")))
    tokens = encoder_states.forward_of("a", "d", output=Output.TOKENS)
    assert tokens.keywords["output"] is encoder.states
    with pytest.raises(ValueError, match="answers no token vectors"):
        task_for(BASE).forward_of("a", "d", output=Output.TOKENS)
