"""The one rerank path: a query and documents to a score call under the model's task and recipe,
and the outputs of its score rows to relevances. `Engine.rerank`, `Engine.score_pairs` and
`ScoringModel.rerank` (and through them the REPL and every HTTP route) all go through it.
"""

from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

import numpy as np
import tokenizers
import trio

from engine.errors import InvalidInput
from engine.host import inputs, truncation
from engine.host.pairs import PairOptions
from engine.kinds import Output
from engine.messages import ScoreRequest, Timings
from engine.results import ScoreResult
from engine.tasks import Task

DOCUMENTS = {"items": "documents"}  # rerank's name for the items of its score call


class RerankOptions(NamedTuple):
    """How a rerank's documents are cut, on token ids (`engine.host.truncation`): each to
    `max_tokens_per_doc` of its own tokens, and so that each sequence has at most `fit` tokens,
    keeping the first ("right") or the last ("left") at `truncation_side`."""

    instruction: str | None = None
    max_tokens_per_doc: int | None = None
    fit: int | None = None
    truncation_side: str = "right"

    def cuts(self) -> bool:
        return self.max_tokens_per_doc is not None or self.fit is not None


class RerankCall(NamedTuple):
    """The score call of a rerank: `Engine`'s and `ScoringModel`'s request fields."""

    query: str | list[int]
    items: list
    label_token_ids: list[int]
    output: Output  # what each row answers (`templates.RerankLabels`)
    pairs: PairOptions | None  # a cross-encoder's pairs; None: items follow the query
    truncated: int = 0  # tokens the documents' cut took off (pairs count theirs as they encode)

    def request(self) -> ScoreRequest:
        return ScoreRequest(
            query=self.query,
            items=self.items,
            label_token_ids=self.label_token_ids,
            output=self.output,
            pairs=self.pairs,
        )


def check_rerank(query, documents, top_n=None, max_tokens_per_doc=None, side="right") -> None:
    """InvalidInput naming the field unless the rerank's arguments are well formed."""
    if not isinstance(query, str):
        raise InvalidInput("query", "must be a string")
    if isinstance(documents, str) or not documents:
        raise InvalidInput("documents", "must be a non-empty list of strings")
    if not all(isinstance(d, str) for d in documents):
        raise InvalidInput("documents", "must be a non-empty list of strings")
    for name, value in (("top_n", top_n), ("max_tokens_per_doc", max_tokens_per_doc)):
        bad = isinstance(value, bool) or not isinstance(value, int) or value < 1
        if value is not None and bad:
            raise InvalidInput(name, "must be a positive integer")
    if side not in truncation.SIDES:
        raise InvalidInput("truncation_side", f"must be one of {', '.join(truncation.SIDES)}")


class Reranker:
    """A model's rerank: its task, recipe and tokenizer, and the longest sequence it accepts."""

    def __init__(
        self,
        task: Task,
        template,
        tokenizer: tokenizers.Tokenizer,
        *,
        max_sequence_tokens: int,
        max_items: int | None,
    ):
        self.task = task
        self.template = template
        self.tokenizer = tokenizer
        self.max_sequence_tokens = max_sequence_tokens
        self.max_items = max_items
        # the recipe's labels, or why it cannot read them (`engine.capabilities`)
        self.labels = task.rerank_labels(template, tokenizer)

    def options(
        self,
        instruction: str | None = None,
        max_tokens_per_doc: int | None = None,
        truncate: bool = False,
        max_prompt_tokens: int | None = None,
        truncation_side: str = "right",
    ) -> RerankOptions:
        """The options of a rerank: `truncate` cuts each document so that its prompt fits the
        longest sequence accepted, `max_prompt_tokens` so that it has at most that many."""
        fit = self.max_sequence_tokens if truncate else None
        if max_prompt_tokens is not None:
            bad = isinstance(max_prompt_tokens, bool) or not isinstance(max_prompt_tokens, int)
            if bad or not 1 <= max_prompt_tokens <= self.max_sequence_tokens:
                raise InvalidInput(
                    "max_prompt_tokens",
                    f"must be an integer from 1 to the model context ({self.max_sequence_tokens}). "
                    "Please, select a smaller truncation size.",
                )
            fit = max_prompt_tokens
        return RerankOptions(instruction, max_tokens_per_doc, fit, truncation_side)

    def slow(self, options: RerankOptions) -> bool:
        """Whether `call` tokenises (a caller on an event loop runs it in a thread)."""
        return options.cuts() or self.template.piecewise

    def call(self, query: str, documents: Sequence[str], options: RerankOptions) -> RerankCall:
        """The score call of a rerank of a model that reranks (`Ability.RERANK`); InvalidInput
        naming `documents` (the tokenizer's own item limit, checked before the cutting)."""
        try:
            inputs.normalize_items(documents, self.max_items)
        except InvalidInput as e:
            raise e.renamed(DOCUMENTS) from None
        prompt, items, pairs, cut = self.task.rerank_inputs(
            self.template, self.tokenizer, query, documents, options
        )
        return RerankCall(prompt, items, self.labels.ids, self.labels.output, pairs, cut)

    def relevance(self, outputs: np.ndarray, raw: bool) -> list[float]:
        """Each document's relevance, in document order, from its score row's outputs."""
        return self.task.relevance(outputs, raw).tolist()


Relevance = Callable[[str, list[str]], Awaitable[tuple[list[float], ScoreResult]]]


async def by_query(
    relevance: Relevance, queries: Sequence[str], documents: Sequence[str]
) -> ScoreResult:
    """The relevance of each (queries[i], documents[i]) pair, in pair order (one score per
    pair): the pairs that share a query scored as one call of `relevance(query, texts)`, the
    calls concurrently; the first failure fails the whole and stops the rest. Errors name
    `documents[i]` by pair index."""
    if isinstance(queries, str) or isinstance(documents, str):
        raise InvalidInput("queries/documents", "must be lists of strings")
    if len(queries) != len(documents):
        raise InvalidInput(
            "queries/documents",
            f"{len(queries)} queries for {len(documents)} documents: give one per pair",
        )
    groups: dict[str, list[int]] = {}
    for i, q in enumerate(queries):
        groups.setdefault(q, []).append(i)
    scores = [0.0] * len(documents)
    results: list[ScoreResult] = []
    failed: list[Exception] = []

    async def one(query: str, pairs: list[int], cancel: trio.CancelScope) -> None:
        try:
            group, result = await relevance(query, [documents[i] for i in pairs])
        except InvalidInput as e:
            failed.append(e.reindexed(pairs))
        except Exception as e:
            failed.append(e)
        else:
            for i, s in zip(pairs, group, strict=True):
                scores[i] = s
            results.append(result)
            return
        cancel.cancel()

    async with trio.open_nursery() as nursery:
        for query, pairs in groups.items():
            nursery.start_soon(one, query, pairs, nursery.cancel_scope)
    if failed:
        raise failed[0]
    return ScoreResult(
        scores=[[s] for s in scores],
        prompt_tokens=sum(r.prompt_tokens for r in results),
        cached_tokens=sum(r.cached_tokens for r in results),
        truncated_tokens=sum(r.truncated_tokens for r in results),
        timings=max((r.timings for r in results), key=lambda t: t.total, default=Timings()),
    )
