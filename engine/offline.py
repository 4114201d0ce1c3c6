"""The offline scoring API: `load_model(...)` and `ScoringModel.score(...)`.

It drives the engine's own pieces synchronously: the tokenizer actor's validation and
tokenisation, the packing generator the scheduler uses, and the device program the runner owns.
"""

from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
import tokenizers

from engine import batching, inputs, packing, templates
from engine.buckets import DEFAULT_TOKEN_BUDGET, make_buckets
from engine.embed import INPUT, embed_request
from engine.errors import InvalidInput
from engine.kinds import Output
from engine.loaders import Checkpoint, load_checkpoint
from engine.messages import Tokenized
from engine.models import ModelConfig
from engine.program import DeviceProgram, default_compile_cache_dir
from engine.rerank import DOCUMENTS, Reranker, check_rerank
from engine.tasks import scores_from_logprobs
from engine.tokenizer_actor import TokenizerState


def load_model(
    path: str | Path | None = None,
    *,
    dtype: str = "bfloat16",
    attention: str | None = None,
    dense: str | None = None,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    progress: bool = True,
) -> "ScoringModel":
    """Load a checkpoint (a `.gguf` file or a Hugging Face directory; `None` is the default model).

    `dtype` is the weight dtype ("bfloat16" or "float32"; matmuls accumulate in f32 either way);
    `attention` forces an implementation by name ("reference", "xla", "cpu"), `None` picks by
    backend (the fused native kernel on CPU when it supports the head dim); `dense` forces the
    layer matmul path ("xla", or "cpu": weights packed once for the native kernel of their
    dtype), `None` multiplies each weight shape by the fastest path on this CPU (measured once,
    kept in the compile cache directory: `score_kernels.dense_choice`); `token_budget` bounds the
    tokens of one packed batch; `progress` shows a loading bar.
    """
    return ScoringModel(
        load_checkpoint(path, progress=progress),
        dtype=dtype,
        attention=attention,
        dense=dense,
        token_budget=token_budget,
    )


class ScoringModel:
    """A loaded model that scores query/item pairs by the log-probs of label tokens."""

    def __init__(
        self,
        checkpoint: Checkpoint,
        *,
        dtype: str = "bfloat16",
        attention: str | None = None,
        dense: str | None = None,
        token_budget: int = DEFAULT_TOKEN_BUDGET,
    ):
        self.program = DeviceProgram(
            checkpoint,
            dtype=dtype,
            attention=attention,
            dense=dense,
            dense_cache_dir=default_compile_cache_dir(),
        )
        self.config: ModelConfig = checkpoint.config
        self.task = checkpoint.task
        self.tokenizer: tokenizers.Tokenizer = checkpoint.tokenizer
        self.token_budget = token_budget
        context = self.config.max_position_embeddings
        self.buckets = make_buckets(context, token_budget=token_budget, window=self.config.window)
        self._tokenizer_state = TokenizerState.for_model(
            checkpoint.tokenizer, self.task, self.buckets, max_items=None, cache_size=0
        )
        family = self.config.family
        self.template = templates.template_for(family, self.tokenizer, checkpoint.source)
        self.reranker = Reranker(
            self.task,
            self.template,
            self.tokenizer,
            max_sequence_tokens=self.buckets.max_sequence(context),
            max_items=None,
        )

    @property
    def dtype(self) -> str:
        return self.program.dtype

    def score(
        self,
        query: inputs.Query,
        items: inputs.Items,
        label_token_ids: Sequence[int],
        *,
        apply_softmax: bool = False,
        item_first: bool = False,
    ) -> list[list[float]]:
        """Per item, the probability of each label token at the end of `query + item`.

        Semantics of sglang's `/v1/score`: each score is `exp(logprob)` under the full
        vocabulary, or with `apply_softmax` the softmax over the label log-probs only.
        """
        refused = self.task.label_scores_refused()
        if refused:
            raise InvalidInput("label_token_ids", refused)
        request = self.tokenize(query, items, label_token_ids, item_first=item_first)
        seqs = request.sequences
        if not seqs:
            return []
        logprobs = self.label_logprobs(seqs, [request.labels] * len(seqs))  # f32[N, L]
        return scores_from_logprobs(logprobs, apply_softmax=apply_softmax).tolist()

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        instruction: str | None = None,
        max_tokens_per_doc: int | None = None,
        truncate: bool = False,
        max_prompt_tokens: int | None = None,
        truncation_side: str = "right",
        raw_scores: bool = False,
    ) -> list[float]:
        """Each document's relevance to `query`, in document order, exactly as `Engine.rerank`
        scores it with the same options (`engine.rerank`): a decoder under its rerank recipe, a
        cross-encoder on the (query, document) pair truncated to its max length as CrossEncoder
        does; no documents, no relevances. Unsupported when the model cannot rerank; InvalidInput
        naming the field for bad input."""
        if isinstance(documents, list | tuple) and not documents:
            return []
        check_rerank(query, documents, None, max_tokens_per_doc, truncation_side)
        options = self.reranker.options(
            instruction, max_tokens_per_doc, truncate, max_prompt_tokens, truncation_side
        )
        call = self.reranker.call(query, documents, options)
        try:
            tokenized = self._tokenizer_state.tokenize(
                call.query,
                call.items,
                call.label_token_ids,
                output=call.output,
                pairs=call.pairs,
            )
        except InvalidInput as e:
            raise e.renamed(DOCUMENTS) from None
        seqs = tokenized.sequences
        outputs = self.label_logprobs(seqs, [tokenized.labels] * len(seqs))  # f32[N, L]
        return self.reranker.relevance(outputs, raw_scores)

    def tokenize(
        self,
        query: inputs.Query,
        items: inputs.Items,
        label_token_ids: Sequence[int],
        *,
        item_first: bool = False,
    ) -> Tokenized:
        """The validated token sequences `score` would run, one per item, exactly as the engine's
        tokenizer builds them; InvalidInput (a ValueError) naming the field otherwise."""
        return self._tokenizer_state.tokenize(query, items, label_token_ids, item_first=item_first)

    def sequences(
        self, query: inputs.Query, items: inputs.Items, *, item_first: bool = False
    ) -> list[list[int]]:
        """The validated token sequences `score` would run, one per item (labels aside)."""
        return inputs.as_lists(self.tokenize(query, items, [0], item_first=item_first).sequences)

    def embed(
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
    ) -> np.ndarray:
        """One vector per text, f32[N, D], exactly as `Engine.embed` computes it with the same
        options. Unsupported when the model is no embedder; InvalidInput naming the field."""
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
        seqs = self._embedded(call, Output.POOLED)
        width = self.task.row_width(Output.POOLED, 0)
        outputs = self.label_logprobs(seqs, [[]] * len(seqs), width=width, output=Output.POOLED)
        return call.vectors(self.task, outputs)

    def embed_tokens(
        self,
        texts: Sequence[str] | Sequence[Sequence[int]],
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        truncate: bool = False,
        truncation_side: str = "right",
        max_tokens: int | None = None,
    ) -> list[np.ndarray]:
        """Every token's vector f32[n, E] of each text, exactly as `Engine.embed_tokens`
        computes it with the same options."""
        call = embed_request(
            self.task,
            texts,
            prompt_name=prompt_name,
            prompt=prompt,
            truncate=truncate,
            side=truncation_side,
            max_tokens=max_tokens,
        )
        seqs = self._embedded(call, Output.TOKENS)
        out: list[np.ndarray] = [np.zeros(0)] * len(seqs)
        layout = self.task.layout(Output.TOKENS)
        batches = batching.batches(
            seqs, [[]] * len(seqs), token_budget=self.token_budget, buckets=self.buckets,
            layout=layout,
        )  # fmt: skip
        for batch in batches:
            states = np.asarray(self.program.run(batch.inputs, Output.TOKENS))  # f32[T, E]
            spans = packing.token_spans(batch, seqs, layout)
            for i, (start, end) in zip(batch.order, spans, strict=True):
                out[i] = states[start:end].copy()
        return out

    def _embedded(self, call, output: Output) -> list:
        """The token sequences of an embed call's inputs; InvalidInput naming `input[i]`."""
        try:
            tokenized = self._tokenizer_state.tokenize(
                "", call.inputs, [], output=output, pairs=call.pairs
            )
            return tokenized.sequences
        except InvalidInput as e:
            raise e.renamed(INPUT) from None

    def label_logprobs(
        self,
        seqs: Sequence[Sequence[int]],
        labels: Sequence[Sequence[int]],
        width: int = 0,
        output: Output | None = None,
    ) -> np.ndarray:
        """Log-probs f32[N, L] of `labels[i]` after `seqs[i]` (the outputs' first `width`
        columns when given: an embedder's vectors), packed into prefix batches.

        Each batch is dispatched before the next is built, so host packing overlaps the device.
        """
        width = width or max(len(lab) for lab in labels)
        out = np.zeros((len(seqs), width), np.float32)
        pending = None
        batches = batching.batches(
            seqs,
            labels,
            token_budget=self.token_budget,
            buckets=self.buckets,
            layout=self.task.layout(output or self.program.output),
        )
        for batch in batches:
            running = (self.program.run(batch.inputs, output), batch.order)
            if pending is not None:
                _collect(out, *pending)
            pending = running
        _collect(out, *pending)
        return out


def _collect(out: np.ndarray, result: jax.Array, order: list[int]) -> None:
    result = np.asarray(result)  # f32[S_bucket, L_bucket]
    width = min(result.shape[1], out.shape[1])
    out[order, :width] = result[: len(order), :width]
