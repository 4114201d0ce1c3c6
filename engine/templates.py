"""Rerank recipes: how a query/document pair becomes a score call on a "yes" vs "no" label,
or on one label's logit.

The Qwen3 template is the official Qwen3-Reranker prompt, byte for byte. mxbai-rerank-v2 is
Mixedbread's prompt on Qwen2, its answer "1" vs "0", tokenised part by part as its reference
code does. bge-reranker-v2-gemma is BAAI's prompt on Gemma, tokenised part by part as its
reference code does; its score is the logit of "Yes" alone. Other chat models that speak ChatML
get the Qwen3 judgement prompt without the thinking block; anything else gets a plain text
prompt whose answer follows a space. A recipe is chosen from the checkpoint (`template_for`) or
forced by name (`EngineConfig.reranker`).
"""

from pathlib import Path
from typing import NamedTuple

import tokenizers

from engine.kinds import Output

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
    separator, the document, the separator, the task (or the instruction that replaces it) and
    the `suffix`. `no` None: the score is the logit of `yes` alone."""

    name: str
    prefix: str
    suffix: str
    yes: str
    no: str | None
    query_format: str  # {query}
    document_format: str  # {document}
    # {instruction}, before the query when an instruction is given; None: it replaces the task
    instruction_format: str | None
    separator: str
    task: str
    prefix_token: bool = False  # the prefix is one special token the tokenizer must have
    piecewise = True

    def query_parts(self, query: str, instruction: str | None) -> list[str]:
        text = self.query_format.format(query=query)
        if instruction and self.instruction_format is not None:
            text = self.instruction_format.format(instruction=instruction) + self.separator + text
        return [self.prefix, text]

    def document_parts(self, document: str, instruction: str | None = None) -> list[str]:
        body = self.document_format.format(document=document)
        task = instruction if instruction and self.instruction_format is None else self.task
        return [self.separator, body, self.separator, task, self.suffix]

    def query_text(self, query: str, instruction: str | None) -> str:
        """The query part as text (its ids are `query_ids`)."""
        return "".join(self.query_parts(query, instruction))

    def document_text(self, document: str, instruction: str | None = None) -> str:
        return "".join(self.document_parts(document, instruction))

    def query_ids(self, tok: tokenizers.Tokenizer, query: str, instruction: str | None):
        return _ids(tok, self.query_parts(query, instruction))

    def document_ids(
        self, tok: tokenizers.Tokenizer, document: str, instruction: str | None = None
    ) -> list[int]:
        return _ids(tok, self.document_parts(document, instruction))


def _ids(tok: tokenizers.Tokenizer, parts: list[str]) -> list[int]:
    return [i for enc in tok.encode_batch_fast(parts, add_special_tokens=False) for i in enc.ids]


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
BGE_RERANKER_V2_GEMMA = PiecewiseTemplate(
    name="bge-reranker-v2-gemma",
    prefix="<bos>",
    suffix="",
    yes="Yes",
    no=None,
    query_format="A: {query}",
    document_format="B: {document}",
    instruction_format=None,
    separator="\n",
    task="Given a query A and a passage B, determine whether the passage contains an answer to "
    "the query by providing a prediction of either 'Yes' or 'No'.",
    prefix_token=True,
)
RECIPES = {
    t.name: t for t in (QWEN3_RERANKER, MXBAI_RERANK_V2, BGE_RERANKER_V2_GEMMA, CHATML, PLAIN)
}
Template = RerankTemplate | PiecewiseTemplate


def template_for(
    family: str,
    tokenizer: tokenizers.Tokenizer,
    checkpoint: str | None = None,
    forced: str | None = None,
) -> Template:
    """The recipe a model is prompted with: `forced` by name, else from the checkpoint's name
    (mxbai-rerank-v2, bge-reranker-v2-gemma), its family (Qwen3) or its tokenizer (ChatML, else
    plain text)."""
    if forced is not None:
        if forced not in RECIPES:
            raise ValueError(f"reranker: {forced!r} is not one of {', '.join(RECIPES)}")
        return RECIPES[forced]
    name = Path(checkpoint).name.lower() if checkpoint is not None else ""
    if "mxbai-rerank" in name:
        return MXBAI_RERANK_V2
    if "bge-reranker-v2-gemma" in name:
        return BGE_RERANKER_V2_GEMMA
    if family == "qwen3":
        return QWEN3_RERANKER
    if tokenizer.token_to_id("<|im_start|>") is not None:
        return CHATML
    return PLAIN


def label_ids(template: Template, tokenizer: tokenizers.Tokenizer) -> tuple[int, ...]:
    """Token ids of the template's yes and no answers (yes alone when it has no "no");
    ValueError unless each is one token, and the tokenizer has the prefix token a template
    starts with (Gemma's BOS)."""
    words = (template.yes,) if template.no is None else (template.yes, template.no)
    ids = [tokenizer.encode(t, add_special_tokens=False).ids for t in words]
    if any(len(i) != 1 for i in ids):
        raise ValueError(
            f"rerank template {template.name!r}: {' / '.join(map(repr, words))} are not single "
            "tokens for this tokenizer"
        )
    if getattr(template, "prefix_token", False) and tokenizer.token_to_id(template.prefix) is None:
        raise ValueError(
            f"rerank template {template.name!r}: the tokenizer has no {template.prefix!r} token"
        )
    return tuple(i[0] for i in ids)


def rerank_inputs(
    template: Template, tokenizer: tokenizers.Tokenizer, query: str, documents, instruction
) -> tuple:
    """A rerank's score call, query and items: the recipe's texts (joined whole when
    tokenised), or a piecewise recipe's ids."""
    t = template
    if not t.piecewise:
        return t.query_text(query, instruction), [t.document_text(d) for d in documents]
    items = [t.document_ids(tokenizer, d, instruction) for d in documents]
    return t.query_ids(tokenizer, query, instruction), items


class RerankLabels(NamedTuple):
    """The labels a rerank reads at each score row."""

    ids: list[int]
    # what each row answers: the labels' log-probs, or (one label: its logit) their logits
    output: Output


def rerank_labels(template: Template, tokenizer) -> RerankLabels | str:
    """The labels a language model's rerank reads at each score row: the template's yes/no
    tokens (its yes token's logit when it has no "no"); a string says why the model
    cannot rerank (score still works)."""
    try:
        ids = label_ids(template, tokenizer)
    except ValueError as e:
        return str(e)
    return RerankLabels(list(ids), Output.LOGITS if template.no is None else Output.LOGPROBS)
