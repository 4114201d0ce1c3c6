"""Rerank recipes: how a query/document pair becomes a score call on a "yes" vs "no" label.

The Qwen3 template is the official Qwen3-Reranker prompt, byte for byte. mxbai-rerank-v2 is
Mixedbread's prompt on Qwen2, its answer "1" vs "0", tokenised part by part as its reference
code does. Other chat models that speak ChatML get the Qwen3 judgement prompt without the
thinking block; anything else gets a plain text prompt whose answer follows a space. A recipe is
chosen from the checkpoint (`template_for`) or forced by name (`EngineConfig.reranker`).
"""

from pathlib import Path
from typing import NamedTuple

import tokenizers

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
_SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".'
)


class RerankTemplate(NamedTuple):
    """Text before and after the query and document, and the label tokens read at the end; the
    query part and the document part are each joined to one text, tokenised whole."""

    name: str
    prefix: str
    suffix: str
    yes: str
    no: str
    piecewise = False  # the texts are joined, then tokenised (`PiecewiseTemplate`: by part)

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


class PiecewiseTemplate(NamedTuple):
    """A recipe whose reference code tokenises each part on its own (no special tokens added)
    and concatenates the ids: `prefix`, the (instruction and) query, then per document the
    separator, the document, the separator, the task and the `suffix`."""

    name: str
    prefix: str
    suffix: str
    yes: str
    no: str
    query_format: str  # {query}
    document_format: str  # {document}
    instruction_format: str  # {instruction}; before the query, when an instruction is given
    separator: str
    task: str
    piecewise = True

    def query_parts(self, query: str, instruction: str | None) -> list[str]:
        text = self.query_format.format(query=query)
        if instruction:
            text = self.instruction_format.format(instruction=instruction) + self.separator + text
        return [self.prefix, text]

    def document_parts(self, document: str) -> list[str]:
        body = self.document_format.format(document=document)
        return [self.separator, body, self.separator, self.task, self.suffix]

    def query_text(self, query: str, instruction: str | None) -> str:
        """The query part as text (its ids are `query_ids`)."""
        return "".join(self.query_parts(query, instruction))

    def document_text(self, document: str) -> str:
        return "".join(self.document_parts(document))

    def query_ids(self, tok: tokenizers.Tokenizer, query: str, instruction: str | None):
        return _ids(tok, self.query_parts(query, instruction))

    def document_ids(self, tok: tokenizers.Tokenizer, document: str) -> list[int]:
        return _ids(tok, self.document_parts(document))


def _ids(tok: tokenizers.Tokenizer, parts: list[str]) -> list[int]:
    return [i for enc in tok.encode_batch(parts, add_special_tokens=False) for i in enc.ids]


MXBAI_RERANK_V2 = PiecewiseTemplate(
    name="mxbai-rerank-v2",
    prefix="<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\n<|im_start|>user\n",
    suffix="<|im_end|>\n<|im_start|>assistant\n",
    yes="1",
    no="0",
    query_format="query: {query}",
    document_format="document: {document}",
    instruction_format="instruction: {instruction}",
    separator="\n",
    task="You are a search relevance expert who evaluates how well documents match search "
    "queries. For each query-document pair, carefully analyze the semantic relationship between "
    "them, then provide your binary relevance judgment (0 for not relevant, 1 for relevant).\n"
    "Relevance:",
)
RECIPES = {t.name: t for t in (QWEN3_RERANKER, MXBAI_RERANK_V2, CHATML, PLAIN)}
Template = RerankTemplate | PiecewiseTemplate


def template_for(
    family: str,
    tokenizer: tokenizers.Tokenizer,
    checkpoint: str | None = None,
    forced: str | None = None,
) -> Template:
    """The recipe a model is prompted with: `forced` by name, else from the checkpoint's name
    (mxbai-rerank-v2), its family (Qwen3) or its tokenizer (ChatML, else plain text)."""
    if forced is not None:
        if forced not in RECIPES:
            raise ValueError(f"reranker: {forced!r} is not one of {', '.join(RECIPES)}")
        return RECIPES[forced]
    if checkpoint is not None and "mxbai-rerank" in Path(checkpoint).name.lower():
        return MXBAI_RERANK_V2
    if family == "qwen3":
        return QWEN3_RERANKER
    if tokenizer.token_to_id("<|im_start|>") is not None:
        return CHATML
    return PLAIN


def label_ids(template: Template, tokenizer: tokenizers.Tokenizer) -> tuple[int, int]:
    """Token ids of the template's yes and no answers; ValueError unless each is one token."""
    ids = [tokenizer.encode(t, add_special_tokens=False).ids for t in (template.yes, template.no)]
    if any(len(i) != 1 for i in ids):
        raise ValueError(
            f"rerank template {template.name!r}: {template.yes!r} / {template.no!r} are not "
            "single tokens for this tokenizer"
        )
    return ids[0][0], ids[1][0]
