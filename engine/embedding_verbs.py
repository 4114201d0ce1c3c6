"""The `Engine`'s embedding verbs: one vector per text (`embed`), every token's (`embed_tokens`),
a sparse vector (`embed_sparse`), multi-vectors (`embed_multi`) and any of the three from one
forward (`embed_hybrid`), each a request of the output kind the model answers it with
(`Head.output_for`); and the rerank of a model that scores vectors (BGE-M3, ColBERT:
`engine.late_interaction`). A mixin of `Engine`, which holds the state they use."""

import functools
from collections.abc import Sequence

import msgspec
import trio

from engine import late_interaction
from engine.capabilities import Ability
from engine.embed import INPUT, check_active_dims, embed_request, prompt_named
from engine.errors import InvalidInput
from engine.kinds import Output
from engine.messages import HybridRow, Scored, ScoreRequest
from engine.rerank import RerankOptions
from engine.results import (
    EmbedResult,
    HybridEmbedResult,
    MultiVectorResult,
    ScoreResult,
    SparseEmbedResult,
    SparseVector,
    TokenEmbedResult,
)
from engine.tasks.colbert import check_role
from engine.tasks.splade import pruned


class EmbeddingVerbs:
    """`Engine`'s embedding verbs (see the module docstring)."""

    async def embed(
        self,
        texts: Sequence[str] | Sequence[Sequence[int]],
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        truncate: bool = False,
        truncation_side: str = "right",
        dimensions: int | None = None,
        normalize: bool | None = None,
        max_tokens: int | None = None,
    ) -> EmbedResult:
        """One vector f32[D] per text, in order, exactly as the model's sentence-transformers
        directory computes it (its pooling, its normalisation).

        `texts` may instead be token-id sequences, embedded as given (no special tokens added,
        no prompt). `prompt_name` puts that prompt of the directory before each text (a query
        instruction; None: its default prompt, if it names one), `prompt` the text given
        instead, as `SentenceTransformer.encode` does. Texts sharing a prompt compute it once
        (decoders).

        `dimensions` keeps each vector's first components (a Matryoshka-trained model's shorter
        embedding; InvalidInput naming `dimensions` for a width it is not trained for), then
        normalises them if the model does; `normalize` overrides whether it does.

        A text over the model's limit (its `max_seq_length`; `max_tokens` when lower) is refused
        with InputTooLarge naming `input[i]`, or with `truncate` cut at `truncation_side`
        ("right": its end, "left": its start) and the tokens cut counted in `truncated_tokens`.
        Unsupported when the model is not an embedder; other errors as `score`'s, naming
        `input`.
        """
        self.capabilities.require(Ability.EMBED)
        call = embed_request(
            self.task,
            texts,
            prompt_name=prompt_name,
            prompt=prompt,
            truncate=truncate,
            side=truncation_side,
            dimensions=dimensions,
            normalize=normalize,
            max_tokens=max_tokens,
        )
        if self.task.head.output_for(Ability.EMBED) is Output.HYBRID:
            result = await self._per_item(call.request(Output.HYBRID))
            outputs = self.task.head.pooled(result.outputs)
        else:
            try:
                outputs, result = await self.outputs(call.request(Output.POOLED))
            except InvalidInput as e:
                raise e.renamed(INPUT) from None
        return EmbedResult(
            embeddings=call.vectors(self.task, outputs),
            prompt_tokens=result.prompt_tokens,
            timings=result.timings,
            cached_tokens=result.cached_tokens,
            truncated_tokens=result.truncated_tokens,
        )

    async def embed_tokens(
        self,
        texts: Sequence[str] | Sequence[Sequence[int]],
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        truncate: bool = False,
        truncation_side: str = "right",
        max_tokens: int | None = None,
    ) -> TokenEmbedResult:
        """Every token's vector f32[n, E] of each text, in order: the final hidden state of each
        of its n tokens (special and prompt tokens included), before pooling, projection or
        normalisation, as `SentenceTransformer.encode(..., output_value="token_embeddings")`
        computes it (TEI's `/embed_all`).

        Each text is computed whole and alone (nothing shared with other texts or read from
        the KV cache). The options and errors are `embed`'s.
        """
        self.capabilities.require(Ability.EMBED_TOKENS)
        call = embed_request(
            self.task,
            texts,
            prompt_name=prompt_name,
            prompt=prompt,
            truncate=truncate,
            side=truncation_side,
            max_tokens=max_tokens,
        )
        scored = await self._per_item(call.request(Output.TOKENS))
        return TokenEmbedResult(
            embeddings=scored.outputs,
            prompt_tokens=scored.prompt_tokens,
            timings=scored.timings,
            truncated_tokens=scored.truncated_tokens,
        )

    async def embed_sparse(
        self,
        texts: Sequence[str] | Sequence[Sequence[int]],
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        truncate: bool = False,
        truncation_side: str = "right",
        max_tokens: int | None = None,
        max_active_dims: int | None = None,
    ) -> SparseEmbedResult:
        """A SPLADE model's sparse vector of each text, in order: its non-zero vocabulary
        entries (ids ascending, weights > 0), exactly as `SparseEncoder.encode` computes them
        on the model's directory. `max_active_dims` keeps each vector's that many largest
        entries (sentence-transformers' option of that name; None: all).

        Only the non-zero entries leave the device. The options and errors are `embed`'s;
        Unsupported when the model is not a sparse encoder.
        """
        self.capabilities.require(Ability.EMBED_SPARSE)
        keep = check_active_dims(max_active_dims)
        call = embed_request(
            self.task,
            texts,
            prompt_name=prompt_name,
            prompt=prompt,
            truncate=truncate,
            side=truncation_side,
            max_tokens=max_tokens,
        )
        head = self.task.head
        scored = await self._per_item(call.request(head.output_for(Ability.EMBED_SPARSE)))
        if scored.outputs and isinstance(scored.outputs[0], HybridRow):
            vectors = [head.lexical(row) for row in scored.outputs]
        else:
            vectors = scored.outputs
        return SparseEmbedResult(
            embeddings=[SparseVector(*pruned(i, v, keep)) for i, v in vectors],
            prompt_tokens=scored.prompt_tokens,
            timings=scored.timings,
            truncated_tokens=scored.truncated_tokens,
        )

    async def embed_multi(
        self,
        texts: Sequence[str] | Sequence[Sequence[int]],
        *,
        input_type: str = "document",
        prompt_name: str | None = None,
        prompt: str | None = None,
        truncate: bool = False,
        truncation_side: str = "right",
        max_tokens: int | None = None,
    ) -> MultiVectorResult:
        """Each text's multi-vectors f32[n, D], for late interaction (MaxSim).

        A ColBERT model's (`engine.tasks.colbert`) encode each text as `input_type` says, as
        PyLate's `ColBERT.encode(..., is_query=input_type == "query")` does: a "query" with
        its marker and expanded to the query length, every token's vector; a "document" with
        its marker, its skiplist tokens' vectors left out. Its limit is that role's length.
        BGE-M3's are the normalised colbert projection of each token after the first, as
        `BGEM3FlagModel.encode(..., return_colbert_vecs=True)` computes them, the same for
        either role. Token-id inputs are encoded as given (no marker, no expansion).

        The options and errors are `embed`'s; InvalidInput naming `input_type` for another
        role; Unsupported for a model without a multi-vector head."""
        self.capabilities.require(Ability.EMBED_MULTI)
        check_role(input_type)
        given = dict(
            prompt_name=prompt_name,
            prompt=prompt,
            truncate=truncate,
            truncation_side=truncation_side,
            max_tokens=max_tokens,
        )
        head = self.task.head
        if head.output_for(Ability.EMBED_MULTI) is Output.HYBRID:
            answer = await self.embed_hybrid(texts, dense=False, sparse=False, **given)
            vectors = answer.multi
        else:
            side = given.pop("truncation_side")
            call = embed_request(self.task, texts, side=side, role=input_type, **given)
            answer = await self._per_item(call.request(Output.MULTI))
            vectors = [head.multi(row, input_type) for row in answer.outputs]
        return MultiVectorResult(
            embeddings=vectors,
            prompt_tokens=answer.prompt_tokens,
            timings=answer.timings,
            truncated_tokens=answer.truncated_tokens,
        )

    async def embed_hybrid(
        self,
        texts: Sequence[str] | Sequence[Sequence[int]],
        *,
        dense: bool = True,
        sparse: bool = True,
        multi: bool = True,
        prompt_name: str | None = None,
        prompt: str | None = None,
        truncate: bool = False,
        truncation_side: str = "right",
        dimensions: int | None = None,
        normalize: bool | None = None,
        max_tokens: int | None = None,
        max_active_dims: int | None = None,
    ) -> HybridEmbedResult:
        """Any of each text's dense vector (`embed`'s), sparse lexical weights (`embed_sparse`'s)
        and multi-vectors (`embed_multi`'s), all from ONE forward of each text: BGE-M3's three
        outputs, as `BGEM3FlagModel.encode(..., return_dense=dense, return_sparse=sparse,
        return_colbert_vecs=multi)` computes them. Those not asked for are None. The options and
        errors are `embed`'s and `embed_sparse`'s; InvalidInput naming `dense` when none is
        asked for, Unsupported for a model without these heads."""
        self.capabilities.require(Ability.EMBED_HYBRID)
        if not (dense or sparse or multi):
            raise InvalidInput("dense", "ask for at least one of dense, sparse and multi")
        keep = check_active_dims(max_active_dims)
        call = embed_request(
            self.task,
            texts,
            prompt_name=prompt_name,
            prompt=prompt,
            truncate=truncate,
            side=truncation_side,
            dimensions=dimensions,
            normalize=normalize,
            max_tokens=max_tokens,
        )
        head, scored = self.task.head, await self._per_item(call.request(Output.HYBRID))
        rows = scored.outputs
        lexical = (head.lexical(r) for r in rows)
        return HybridEmbedResult(
            dense=call.vectors(self.task, head.pooled(rows)) if dense else None,
            sparse=[SparseVector(*pruned(i, v, keep)) for i, v in lexical] if sparse else None,
            multi=[head.multi(r) for r in rows] if multi else None,
            prompt_tokens=scored.prompt_tokens,
            timings=scored.timings,
            truncated_tokens=scored.truncated_tokens,
        )

    async def _per_item(self, request: ScoreRequest) -> Scored:
        """The answer to an embed call's `request` of a ragged output (`Output.ragged`), each
        item's of its own, its timings' total counted; errors name `input`."""
        start = trio.current_time()
        try:
            scored = await self.pipeline.submit(request)
        except InvalidInput as e:
            raise e.renamed(INPUT) from None
        total = trio.current_time() - start
        return msgspec.structs.replace(
            scored, timings=msgspec.structs.replace(scored.timings, total=total)
        )

    async def _vector_relevance(
        self, query: str, documents: Sequence[str], options: RerankOptions
    ) -> tuple[list[float], ScoreResult]:
        """A rerank by vectors (`engine.late_interaction`): BGE-M3's weighted relevance, a
        ColBERT model's MaxSim, or an embedder's cosine similarity. The query (after the
        instruction, if any, else an embedder's "query" prompt) and the documents (an
        embedder's "document" prompt) are encoded at once, the query once for all of them;
        each document cut to `max_tokens_per_doc` and every text to `fit` where asked, and a
        ColBERT model's texts always to their role's length (as PyLate reranks)."""
        output = self.task.head.output_for(Ability.RERANK)
        hybrid, dense = output is Output.HYBRID, output is Output.POOLED
        limits = [n for n in (options.max_tokens_per_doc, options.fit) if n is not None]
        cut = dict(truncate=bool(limits) or not hybrid, truncation_side=options.truncation_side)
        answers, failed = {}, []

        async def encode(name: str, texts: list[str], cancel: trio.CancelScope, **given) -> None:
            try:
                if hybrid:
                    answers[name] = await self.embed_hybrid(texts, **cut, **given)
                elif dense:
                    answers[name] = await self.embed(texts, **cut, **given)
                else:
                    role = "query" if name == "query" else "document"
                    answers[name] = await self.embed_multi(texts, input_type=role, **cut, **given)
            except InvalidInput as e:  # named as the rerank names its fields
                failed.append(e if name == "documents" else type(e)(name, e.detail))
                cancel.cancel()
            except Exception as e:  # the first failure fails the rerank
                failed.append(e)
                cancel.cancel()

        async with trio.open_nursery() as nursery:
            fit = {"max_tokens": options.fit} if options.fit else {}
            query_prompt, doc_prompt = _prompts(self.task, dense, options.instruction)
            query_call = functools.partial(encode, **query_prompt, **fit)
            nursery.start_soon(query_call, "query", [query], nursery.cancel_scope)
            doc_limit = {"max_tokens": min(limits)} if limits else {}
            doc_call = functools.partial(encode, **doc_prompt, **doc_limit)
            nursery.start_soon(doc_call, "documents", list(documents), nursery.cancel_scope)
        if failed:
            error = failed[0]
            raise (
                error.renamed({"input": "documents"}) if isinstance(error, InvalidInput) else error
            )
        q, d = answers["query"], answers["documents"]
        if hybrid:
            scores = late_interaction.relevance(q, d, self.config.hybrid_weights).tolist()
        elif dense:
            scores = late_interaction.cosine(q.embeddings[0], d.embeddings).tolist()
        else:
            scores = [late_interaction.colbert(q.embeddings[0], v) for v in d.embeddings]
        timings = msgspec.structs.replace(d.timings, total=max(q.timings.total, d.timings.total))
        result = ScoreResult(
            scores=[],
            prompt_tokens=q.prompt_tokens + d.prompt_tokens,
            timings=timings,
            truncated_tokens=q.truncated_tokens + d.truncated_tokens,
        )
        return scores, result


def _prompts(task, dense: bool, instruction: str | None) -> tuple[dict, dict]:
    """The query's and the documents' prompt arguments in a rerank by vectors: the instruction
    before the query; else an embedder's "query" prompt before it and its "document" (or
    "passage", "corpus") prompt before each document where it has them, as
    sentence-transformers' `encode_query` and `encode_document` choose (None: its default)."""
    if not dense:
        return {"prompt": instruction}, {}
    query = {"prompt": instruction} if instruction else {"prompt_name": prompt_named(task, "query")}
    names = (prompt_named(task, kind) for kind in ("document", "passage", "corpus"))
    return query, {"prompt_name": next((n for n in names if n), None)}
