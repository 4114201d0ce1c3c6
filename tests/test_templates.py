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
