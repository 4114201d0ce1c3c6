"""Rerank templates: the official Qwen3-Reranker prompt byte for byte, and the fallbacks."""

import pytest

from engine import templates
from tests.conftest import tiny_tokenizer

QWEN3_PROMPT = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: What is the capital of China?\n<Document>: The capital of China "
    "is Beijing.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


def test_qwen3_template_is_the_official_prompt():
    t = templates.QWEN3_RERANKER
    text = t.query_text("What is the capital of China?", None) + t.document_text(
        "The capital of China is Beijing."
    )
    assert text == QWEN3_PROMPT
    assert (t.yes, t.no) == ("yes", "no")


def test_instruction_replaces_the_default():
    text = templates.CHATML.query_text("q", "Find code")
    assert text.endswith("<Instruct>: Find code\n<Query>: q\n<Document>: ")


def test_template_choice_by_family_and_vocabulary():
    from tokenizers import AddedToken

    tok = tiny_tokenizer()
    assert templates.template_for("qwen3", tok) is templates.QWEN3_RERANKER
    assert templates.template_for("llama", tok) is templates.PLAIN
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True)])
    assert templates.template_for("llama", tok) is templates.CHATML


def test_labels_must_be_single_tokens():
    tok = tiny_tokenizer()
    yes, no = templates.label_ids(templates.PLAIN, tok)
    assert tok.decode([yes]) == " yes" and tok.decode([no]) == " no"
    bad = templates.PLAIN._replace(yes=" affirmative indeed")
    with pytest.raises(ValueError, match="are not single tokens"):
        templates.label_ids(bad, tok)


MXBAI_PROMPT = (  # mixedbread's prompt, its parts joined (each is tokenised on its own)
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\n<|im_start|>user\ninstruction: Find code\nquery: Who wrote it?\ndocument: "
    "Harper Lee.\nYou are a search relevance expert who evaluates how well documents match "
    "search queries. For each query-document pair, carefully analyze the semantic relationship "
    "between them, then provide your binary relevance judgment (0 for not relevant, 1 for "
    "relevant).\nRelevance:<|im_end|>\n<|im_start|>assistant\n"
)


def test_mxbai_recipe_is_mixedbreads_prompt_tokenised_by_part():
    t, tok = templates.MXBAI_RERANK_V2, tiny_tokenizer()
    assert t.query_text("Who wrote it?", "Find code") + t.document_text("Harper Lee.") == (
        MXBAI_PROMPT
    )
    assert "instruction:" not in t.query_text("q", None)
    parts = [*t.query_parts("Who?", None), *t.document_parts("Lee.")]
    want = [i for p in parts for i in tok.encode(p, add_special_tokens=False).ids]
    assert t.query_ids(tok, "Who?", None) + t.document_ids(tok, "Lee.") == want
    assert (t.yes, t.no) == ("1", "0")


def test_recipe_choice_by_name_and_checkpoint():
    tok = tiny_tokenizer()
    name = "/models/mxbai-rerank-base-v2"
    assert templates.template_for("qwen2", tok, name) is templates.MXBAI_RERANK_V2
    assert templates.template_for("llama", tok, None, "qwen3-reranker") is templates.QWEN3_RERANKER
    with pytest.raises(ValueError, match="reranker: 'bge' is not one of qwen3-reranker, "):
        templates.template_for("llama", tok, None, "bge")
