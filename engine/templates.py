"""Rerank prompt templates: a query/document pair becomes a score call on "yes" vs "no".

The Qwen3 template is the official Qwen3-Reranker prompt, byte for byte. Other chat models that
speak ChatML get the same judgement prompt without the thinking block; anything else gets a plain
text prompt whose answer follows a space.
"""

from typing import NamedTuple

import tokenizers

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
_SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".'
)


class RerankTemplate(NamedTuple):
    """Text before and after the query and document, and the label tokens read at the end."""

    name: str
    prefix: str
    suffix: str
    yes: str
    no: str

    def query_text(self, query: str, instruction: str | None) -> str:
        """Everything up to the document: shared by all documents of one rerank call."""
        instruction = DEFAULT_INSTRUCTION if instruction is None else instruction
        return f"{self.prefix}<Instruct>: {instruction}\n<Query>: {query}\n<Document>: "

    def document_text(self, document: str) -> str:
        return document + self.suffix


QWEN3_RERANKER = RerankTemplate(
    name="qwen3-reranker",
    prefix=f"<|im_start|>system\n{_SYSTEM}<|im_end|>\n<|im_start|>user\n",
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    yes="yes",
    no="no",
)
CHATML = QWEN3_RERANKER._replace(name="chatml", suffix="<|im_end|>\n<|im_start|>assistant\n")
PLAIN = RerankTemplate(
    name="plain",
    prefix=f"{_SYSTEM}\n",
    suffix="\nAnswer:",
    yes=" yes",
    no=" no",
)


def template_for(family: str, tokenizer: tokenizers.Tokenizer) -> RerankTemplate:
    """The template a model of `family` with this tokenizer is prompted with."""
    if family == "qwen3":
        return QWEN3_RERANKER
    if tokenizer.token_to_id("<|im_start|>") is not None:
        return CHATML
    return PLAIN


def label_ids(template: RerankTemplate, tokenizer: tokenizers.Tokenizer) -> tuple[int, int]:
    """Token ids of the template's yes and no answers; ValueError unless each is one token."""
    ids = [tokenizer.encode(t, add_special_tokens=False).ids for t in (template.yes, template.no)]
    if any(len(i) != 1 for i in ids):
        raise ValueError(
            f"rerank template {template.name!r}: {template.yes!r} / {template.no!r} are not "
            "single tokens for this tokenizer"
        )
    return ids[0][0], ids[1][0]
