"""Reranker heads and recipes against `transformers` on tiny random checkpoints: the
sequence-classification heads of the decoder families (`*ForSequenceClassification`: the head's
logits at the score row; rerank the sigmoid of a one-label head, the softmax's last label of
several; packed batches equal one-by-one scoring; label-token scores refused with a clear
error), and the mxbai-rerank-v2 and bge-reranker-v2-gemma recipes equal to their reference
formulas."""

import shutil

import msgspec
import numpy as np
import pytest
import torch
import transformers
import trio

from api.app import create_app
from api.routes import RERANK_PATHS
from api.settings import settings_from_env
from engine import InvalidInput, Unsupported, load_model, open_engine, templates
from engine.capabilities import Ability
from engine.tasks.outputs import classifier_relevance
from tests.conftest import tiny_tokenizer, write_tiny_checkpoint
from tests.test_api_support import serving, tiny_config, tiny_env

HEADS = [("qwen3", 1), ("qwen2", 1), ("llama-untied", 2), ("gemma", 1), ("gemma2", 1)]
HEADS += [("gemma3", 2)]
QUERY = "Where does the fox jump?"
DOCS = ["The quick brown fox jumps over the lazy dog.", "Numbers 0 1 2 3", "yes no yes"]


@pytest.fixture(scope="module", params=HEADS, ids=[f"{f}-{n}" for f, n in HEADS])
def checkpoint(request, tmp_path_factory):
    family, labels = request.param
    root = tmp_path_factory.mktemp("heads")
    auto = "AutoModelForSequenceClassification"
    return write_tiny_checkpoint(root, family, auto, num_labels=labels), labels


def hf_logits(path, ids: list[int]) -> np.ndarray:
    """transformers' head logits f32[num_labels] for one unpadded sequence."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        path,
        dtype=torch.float32,
        attn_implementation="eager",  # eager: Gemma 2's soft-capping
    )
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def test_head_logits_equal_transformers(checkpoint):
    path, labels = checkpoint
    model = load_model(str(path), dtype="float32")
    assert model.program.config.num_labels == labels
    tok = model.tokenizer
    seqs = [tok.encode(QUERY + d).ids for d in DOCS]
    ours = model.row_outputs(seqs, [list(range(labels))] * len(seqs))  # f32[N, labels]
    for seq, row in zip(seqs, ours, strict=True):
        np.testing.assert_allclose(row, hf_logits(path, seq), atol=1e-4)
    with pytest.raises(InvalidInput, match="sequence-classification head"):
        model.score(QUERY, DOCS, [1])


def test_rerank_is_the_heads_formula_and_packs_exactly(checkpoint):
    path, labels = checkpoint

    async def main():
        async with open_engine(tiny_config(path)) as engine:
            together = await engine.rerank(QUERY, DOCS)
            raw = await engine.rerank(QUERY, DOCS, raw_scores=True)
            alone = [(await engine.rerank(QUERY, [d])).results[0] for d in DOCS]
            with pytest.raises(InvalidInput, match=r"^label_token_ids: this model has"):
                await engine.score(QUERY, DOCS, [1])
            prompts = [
                engine.tokenizer.encode(
                    engine.template.query_text(QUERY, None) + engine.template.document_text(d)
                ).ids
                for d in DOCS
            ]
            return together, raw, alone, prompts

    together, raw, alone, prompts = trio.run(main)
    logits = np.stack([hf_logits(path, p) for p in prompts])  # transformers on the same prompts
    assert logits.shape == (len(DOCS), labels)
    want = classifier_relevance(logits, raw=False)
    got = {h.index: h.relevance_score for h in together.results}
    np.testing.assert_allclose([got[i] for i in range(3)], want, rtol=1e-4, atol=1e-6)
    got_raw = {h.index: h.relevance_score for h in raw.results}
    np.testing.assert_allclose([got_raw[i] for i in range(3)], logits[:, -1], atol=1e-4)
    np.testing.assert_allclose(
        [got[i] for i in range(3)], [h.relevance_score for h in alone], rtol=1e-5
    )


def test_the_service_says_which_head_and_refuses_label_scores(checkpoint):
    path, labels = checkpoint
    app = create_app(settings_from_env(tiny_env(path)))
    for client in serving(app, "asyncio"):
        info = client.get("/get_model_info").json()
        assert (info["head"], info["num_labels"]) == ("sequence-classification", labels)
        assert info["endpoints"] == [*RERANK_PATHS, "/invocations", "/"]  # no /v1/score
        r = client.post("/v1/score", json={"query": QUERY, "items": DOCS, "label_token_ids": [1]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "label_token_ids"
        r = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
        assert r.status_code == 200 and len(r.json()["results"]) == 3
        r = client.post("/score", json={"queries": QUERY, "documents": DOCS})
        assert r.status_code == 200 and len(r.json()["data"]) == 3


def test_the_mxbai_recipe_equals_its_formula_in_transformers(tiny_checkpoints):
    """Mixedbread's reference: logits[-1, "1"] - logits[-1, "0"] on the parts tokenised one by
    one; the engine's raw score is that, its relevance the sigmoid."""
    path = tiny_checkpoints["qwen2"]
    config = msgspec.structs.replace(tiny_config(path), reranker="mxbai-rerank-v2")

    async def main():
        async with open_engine(config) as engine:
            raw = await engine.rerank(QUERY, DOCS, raw_scores=True, instruction="Find code")
            soft = await engine.rerank(QUERY, DOCS, instruction="Find code")
            return engine.tokenizer, raw, soft

    tok, raw, soft = trio.run(main)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    one, zero = (tok.encode(x, add_special_tokens=False).ids[0] for x in ("1", "0"))
    t = templates.MXBAI_RERANK_V2
    want = []
    for d in DOCS:
        parts = [*t.query_parts(QUERY, "Find code"), *t.document_parts(d)]
        ids = [i for p in parts for i in tok.encode(p, add_special_tokens=False).ids]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        want.append(float(logits[one] - logits[zero]))
    got = {h.index: h.relevance_score for h in raw.results}
    np.testing.assert_allclose([got[i] for i in range(3)], want, atol=1e-4)
    sig = {h.index: h.relevance_score for h in soft.results}
    np.testing.assert_allclose(
        [sig[i] for i in range(3)], 1 / (1 + np.exp(-np.array(want))), rtol=1e-4
    )


@pytest.fixture(scope="module")
def bge_gemma(tiny_checkpoints, tmp_path_factory):
    """The tiny Gemma checkpoint named as BAAI's reranker, its tokenizer given Gemma's `<bos>`
    and a "Yes" token."""
    path = tmp_path_factory.mktemp("bge") / "bge-reranker-v2-gemma"
    shutil.copytree(tiny_checkpoints["gemma"], path)
    tok = tiny_tokenizer()
    tok.add_special_tokens(["<bos>"])
    tok.add_tokens(["Yes"])
    tok.save(str(path / "tokenizer.json"))
    return path


def bge_reference(path, tok, instruction: str | None) -> list[float]:
    """BAAI's reference formula: [bos] + "A: {query}", "\n" + "B: {passage}", "\n" + prompt,
    each part tokenised alone; the score is logits[-1, "Yes"] (the instruction replaces the
    prompt)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    prompt = instruction or templates.BGE_RERANKER_V2_GEMMA.task
    enc = lambda text: tok.encode(text, add_special_tokens=False).ids
    want = []
    for d in DOCS:
        ids = [tok.token_to_id("<bos>"), *enc(f"A: {QUERY}"), *enc("\n"), *enc(f"B: {d}")]
        ids += [*enc("\n"), *enc(prompt)]
        with torch.no_grad():
            want.append(float(model(torch.tensor([ids])).logits[0, -1, tok.token_to_id("Yes")]))
    return want


@pytest.mark.parametrize("instruction", [None, "Find code"])
def test_the_bge_gemma_recipe_equals_its_formula_in_transformers(bge_gemma, instruction):
    """Recognised from the checkpoint's name; the raw score is the "Yes" logit, the relevance
    its sigmoid, through `Engine.rerank` and `/v1/rerank` alike."""

    async def main():
        async with open_engine(tiny_config(bge_gemma)) as engine:
            assert engine.template is templates.BGE_RERANKER_V2_GEMMA
            raw = await engine.rerank(QUERY, DOCS, raw_scores=True, instruction=instruction)
            soft = await engine.rerank(QUERY, DOCS, instruction=instruction)
            return engine.tokenizer, raw, soft

    tok, raw, soft = trio.run(main)
    want = np.array(bge_reference(bge_gemma, tok, instruction))
    by_index = lambda result: [{h.index: h.relevance_score for h in result}[i] for i in range(3)]
    np.testing.assert_allclose(by_index(raw.results), want, atol=1e-4)
    np.testing.assert_allclose(by_index(soft.results), 1 / (1 + np.exp(-want)), rtol=1e-4)
    app = create_app(settings_from_env(tiny_env(bge_gemma)))
    body = {"query": QUERY, "documents": DOCS, **({"instruct": instruction} if instruction else {})}
    for client in serving(app, "asyncio"):
        r = client.post("/v1/rerank", json=body)
        assert r.status_code == 200, r.text
        got = sorted((h["index"], h["relevance_score"]) for h in r.json()["results"])
        np.testing.assert_allclose([s for _, s in got], 1 / (1 + np.exp(-want)), rtol=1e-4)
        info = client.get("/get_model_info").json()
        assert info["rerank_template"] == "bge-reranker-v2-gemma"


def test_a_one_label_recipe_needs_its_tokens(tiny_checkpoints, tmp_path):
    """Forced on a vocabulary without "Yes", or without `<bos>`, the recipe is refused with the
    reason (a 400 over HTTP, and the rerank routes left out of the model's endpoints); score
    still works."""
    path = tmp_path / "gemma-yes"
    shutil.copytree(tiny_checkpoints["gemma"], path)
    tok = tiny_tokenizer()
    tok.add_tokens(["Yes"])
    tok.save(str(path / "tokenizer.json"))
    why = {tiny_checkpoints["gemma"]: "'Yes' are not single tokens", path: "no '<bos>' token"}

    async def main(path):
        config = msgspec.structs.replace(tiny_config(path), reranker="bge-reranker-v2-gemma")
        async with open_engine(config) as engine:
            assert why[path] in engine.capabilities.refusal(Ability.RERANK)
            with pytest.raises(Unsupported, match=why[path]):
                await engine.rerank(QUERY, DOCS)
            return await engine.score(QUERY, DOCS, [5, 17])

    for p in why:
        assert len(trio.run(main, p).scores) == 3
    app = create_app(settings_from_env(tiny_env(path, SCORING_RERANKER="bge-reranker-v2-gemma")))
    for client in serving(app, "asyncio"):
        r = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
        assert r.status_code == 400 and why[path] in r.json()["error"]["message"]
        assert client.get("/v1/models").json()["data"][0]["endpoints"] == [
            "/v1/score",
            "/generative_scoring",
            "/invocations",
            "/",
        ]
        r = client.post("/v1/score", json={"query": QUERY, "items": DOCS, "label_token_ids": [5]})
        assert r.status_code == 200
