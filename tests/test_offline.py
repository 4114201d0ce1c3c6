"""`load_model` / `ScoringModel.score`: sglang semantics, validation, and the real SmolLM2 model."""

import numpy as np
import pytest
import trio

from bench.baseline import hf_label_logprobs, load_transformers
from bench.workloads import PAIRS, SUFFIX
from engine import CheckpointError, EngineConfig, InvalidInput, load_model
from engine.loaders import default_model_path
from engine.tasks import scores_from_logprobs


@pytest.fixture(scope="module")
def tiny(tiny_checkpoints):
    return load_model(tiny_checkpoints["qwen2"], dtype="float32")


def test_text_is_joined_then_tokenised_whole(tiny):
    query, items, labels = "Is the sky blue?", [" Yes it is.", " No, never"], [3, 9]
    ids = [e.ids for e in tiny.tokenizer.encode_batch([query + it for it in items])]
    assert tiny.sequences(query, items, item_first=False) == ids
    by_text = tiny.score(query, items, labels)
    by_hand = scores_from_logprobs(tiny.row_outputs(ids, [labels] * 2), apply_softmax=False)
    np.testing.assert_allclose(by_text, by_hand, rtol=1e-6)


def test_item_first_puts_the_item_before_the_query(tiny):
    q = tiny.tokenizer.encode("query text").ids
    assert tiny.sequences(q, [[7, 8]], item_first=True) == [[7, 8, *q]]
    assert tiny.sequences("Q?", ["item"], item_first=True) == [tiny.tokenizer.encode("itemQ?").ids]


def test_token_ids_are_concatenated(tiny):
    assert tiny.sequences([1, 2], [[3], [4, 5]], item_first=False) == [[1, 2, 3], [1, 2, 4, 5]]


def test_single_string_item_is_one_item(tiny):
    assert len(tiny.score("q", "one item", [1, 2])) == 1


def test_softmax_normalises_over_the_labels(tiny):
    raw = np.array(tiny.score([5, 6, 7], [[8], [9, 10]], [11, 12, 13]))
    soft = np.array(tiny.score([5, 6, 7], [[8], [9, 10]], [11, 12, 13], apply_softmax=True))
    np.testing.assert_allclose(soft.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(soft, raw / raw.sum(axis=1, keepdims=True), rtol=1e-5)
    assert (raw.sum(axis=1) < 1).all()


def test_empty_query_items_and_item_list_follow_sglang(tiny):
    assert tiny.score("text", [], [1]) == []
    assert tiny.score([], [], [1]) == []
    alone = tiny.score("a query", [""], [1, 2])
    assert alone == tiny.score("a query", ["", ""], [1, 2])[:1]
    assert alone == tiny.score("a que", ["ry"], [1, 2])  # the same text, tokenised whole
    assert tiny.score([], [[5, 6]], [1]) == tiny.score([5], [[6]], [1])


@pytest.mark.parametrize(
    ("query", "items", "labels", "match"),
    [
        ("text", [[1, 2]], [1], "query/items: must be all text"),
        ([1, 2], ["text"], [1], "query/items: must be all text"),
        ("", ["ok", ""], [1], r"items\[1\]: no tokens: the query and the item are both empty"),
        ([], [[2], []], [1], r"items\[1\]: no tokens"),
        ("text", ["ok"], [], "label_token_ids: must be a non-empty"),
        ("text", ["ok"], [384], r"label_token_ids: Token ID 384 is out of vocabulary range"),
        ("text", ["ok"], [-1], r"label_token_ids: Token ID -1 is out of vocabulary range"),
        ([1], [[2, 999]], [1], r"items\[0\]: token id outside the vocabulary"),
        ([1] * 500, [[2] * 20], [1], r"items\[0\]: sequence of 520 tokens exceeds .* 512"),
        ([1, True], [[2]], [1], "query/items"),
    ],
)
def test_invalid_input_names_the_problem(tiny, query, items, labels, match):
    with pytest.raises(ValueError, match=match):
        tiny.score(query, items, labels)


def test_bad_options_are_rejected(tiny_checkpoints, tmp_path):
    with pytest.raises(ValueError, match="dtype: 'float16'"):
        load_model(tiny_checkpoints["qwen2"], dtype="float16")
    with pytest.raises(ValueError, match="unknown attention 'flash'"):
        load_model(tiny_checkpoints["qwen2"], attention="flash")
    with pytest.raises(CheckpointError, match="not a Hugging Face model directory"):
        load_model(tmp_path / "missing.gguf")
    with pytest.raises(CheckpointError, match=r"missing config\.json"):
        load_model(tmp_path)


def test_reference_attention_gives_the_same_scores(tiny_checkpoints):
    seqs = [[1, 2, 3, 4, 5], [1, 2, 3, 9], [7] * 70]
    ref = load_model(tiny_checkpoints["qwen3"], dtype="float32", attention="reference")
    xla = load_model(tiny_checkpoints["qwen3"], dtype="float32", attention="xla")
    np.testing.assert_allclose(
        ref.row_outputs(seqs, [[1, 2]] * 3), xla.row_outputs(seqs, [[1, 2]] * 3), atol=1e-5
    )


# --- the real default model ---------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_pair(smollm2):
    import transformers

    hf = load_transformers(smollm2, "float32")
    tok = transformers.AutoTokenizer.from_pretrained(smollm2.parent, gguf_file=smollm2.name)
    return load_model(smollm2, dtype="float32"), hf, tok


def _yes_no(tok):
    return [
        tok.encode(" yes", add_special_tokens=False)[0],
        tok.encode(" no", add_special_tokens=False)[0],
    ]


def test_default_model_is_smollm2(smollm2):
    assert default_model_path() == smollm2


def test_smollm2_matches_transformers(smol_pair):
    model, hf, tok = smol_pair
    labels = _yes_no(tok) + [tok.eos_token_id, 1000]
    texts = [q + it + SUFFIX for q, it in PAIRS]
    seqs = [tok(t).input_ids for t in texts]
    assert [model.tokenizer.encode(t).ids for t in texts] == seqs
    ours = np.concatenate(
        [
            model.row_outputs(model.sequences(q, [it + SUFFIX], item_first=False), [labels])
            for q, it in PAIRS
        ]
    )
    ref = hf_label_logprobs(hf, seqs, labels)
    np.testing.assert_allclose(ours, ref, atol=1e-3, rtol=0)
    soft = [model.score(q, [it + SUFFIX], labels, apply_softmax=True)[0] for q, it in PAIRS]
    np.testing.assert_allclose(soft, scores_from_logprobs(ref, apply_softmax=True), atol=1e-4)
    batched = model.score(PAIRS[0][0], [it + SUFFIX for _, it in PAIRS[:2]], labels)
    np.testing.assert_allclose(np.log(batched), ref[:2], atol=1e-3)


def test_rerank_scores_as_the_engine_does(tiny, tiny_checkpoints):
    import trio

    from engine import EngineConfig, open_engine

    query, docs = "Is the river near?", [" the river is green", " stone house", ""]

    async def main():
        config = EngineConfig(
            model=str(tiny_checkpoints["qwen2"]),
            dtype="float32",
            progress=False,
            precompile=False,
            compile_cache_dir=None,
        )
        async with open_engine(config) as engine:
            return [await engine.rerank(query, docs, raw_scores=raw) for raw in (False, True)]

    for raw, result in zip((False, True), trio.run(main), strict=True):
        want = [{h.index: h.relevance_score for h in result.results}[i] for i in range(3)]
        np.testing.assert_allclose(tiny.rerank(query, docs, raw_scores=raw), want, atol=1e-5)
    assert tiny.rerank(query, []) == []


def test_load_model_takes_engine_config_fields_and_is_the_engines_front(tiny_checkpoints):
    """`load_model` runs the very engine `open_engine` runs, configured by the same struct: its
    options are `EngineConfig` fields (a name that is none is refused), the engine's answers are
    the model's, a call from inside a trio loop works, and a closed model refuses calls."""
    with pytest.raises(TypeError, match="'flash' is not an EngineConfig field"):
        load_model(tiny_checkpoints["qwen2"], flash=True)
    config = EngineConfig(dtype="float32", token_budget=256, progress=False)
    with load_model(tiny_checkpoints["qwen2"], config=config) as model:
        assert model.config.token_budget == 256 and model.engine.config is model.config
        assert model.engine.buckets.tokens[-1] >= 256 and model.program is model.engine.program
        want = model.score("q", ["a", "b"], [3, 9])
        assert trio.run(trio.to_thread.run_sync, model.score, "q", ["a", "b"], [3, 9]) == want

        async def blocking_inside_a_loop():
            return model.score("q", ["a", "b"], [3, 9])

        assert trio.run(blocking_inside_a_loop) == want
        with pytest.raises(InvalidInput, match=r"^label_token_ids: Token ID 999"):
            model.score("q", ["a"], [999])  # the engine's own check, raised here
    with pytest.raises(RuntimeError, match="the model is closed"):
        model.score("q", ["a"], [3])
