"""The offline scoring API: `load_model(...)` and `ScoringModel.score(...)`.

It drives the engine's own pieces synchronously: the tokenizer actor's validation and
tokenisation, the packing generator the scheduler uses, and the device program the runner owns.
"""

from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
import tokenizers

from engine import batching, inputs, templates
from engine.buckets import DEFAULT_TOKEN_BUDGET, make_buckets
from engine.errors import InvalidInput, Unsupported, rejection_error
from engine.loaders import Checkpoint, load_checkpoint
from engine.messages import Rejected, ScoreRequest, Tokenized
from engine.models import ModelConfig
from engine.pairs import PairOptions
from engine.program import DeviceProgram, default_compile_cache_dir
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
    layer matmul path ("xla", or "cpu": bf16 weights packed once for the native kernel), `None`
    multiplies each weight shape by the fastest path on this CPU (measured once, kept in the
    compile cache directory: `kernels.dense_choice`); `token_budget` bounds the tokens of one packed
    batch; `progress` shows a loading bar.
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
        self.tokenizer: tokenizers.Tokenizer = checkpoint.tokenizer
        self.token_budget = token_budget
        self.buckets = make_buckets(
            self.config.max_position_embeddings,
            token_budget=token_budget,
            window=self.config.window,
            bidirectional=self.config.bidirectional,
        )
        self._tokenizer_state = TokenizerState.for_model(
            checkpoint.tokenizer, self.config, self.buckets, max_items=None, cache_size=0
        )
        family = self.config.family
        self.template = templates.template_for(family, self.tokenizer, checkpoint.source)

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
        check_language_model(self.program.config)
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
        raw_scores: bool = False,
    ) -> list[float]:
        """Each document's relevance to `query`, in document order, as `Engine.rerank` scores
        it: a decoder under its rerank recipe, a cross-encoder on the (query, document) pair
        truncated to its max length as CrossEncoder does. Unsupported when the model cannot
        rerank; InvalidInput naming the field for bad input."""
        cfg = self.config
        labels = templates.rerank_labels(cfg, self.template, self.tokenizer)
        if isinstance(labels, str):
            raise Unsupported(f"rerank is unavailable for this model: {labels}")
        pairs = PairOptions(limit=cfg.max_length) if cfg.bidirectional else None
        if pairs is None:
            query, documents = templates.rerank_inputs(
                self.template, self.tokenizer, query, documents, instruction
            )
        request = ScoreRequest(
            id=0,
            query=query,
            items=documents,
            label_token_ids=labels.ids,
            normaliser=labels.normaliser,
            pairs=pairs,
            arrived=0.0,
        )
        tokenized = self._tokenized(request)
        seqs = tokenized.sequences
        if not seqs:
            return []
        outputs = self.label_logprobs(seqs, [tokenized.labels] * len(seqs))  # f32[N, L]
        return relevance(outputs, num_labels=cfg.num_labels, raw=raw_scores).tolist()

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
        request = ScoreRequest(
            id=0,
            query=query,
            items=items,
            label_token_ids=label_token_ids,
            item_first=item_first,
            arrived=0.0,
        )
        return self._tokenized(request)

    def _tokenized(self, request: ScoreRequest) -> Tokenized:
        (out,) = self._tokenizer_state.process([request])
        if isinstance(out, Rejected):
            raise rejection_error(out.kind, out.message, out.field)
        return out

    def sequences(
        self, query: inputs.Query, items: inputs.Items, *, item_first: bool = False
    ) -> list[list[int]]:
        """The validated token sequences `score` would run, one per item (labels aside)."""
        return self.tokenize(query, items, [0], item_first=item_first).sequences

    def label_logprobs(
        self, seqs: Sequence[Sequence[int]], labels: Sequence[Sequence[int]]
    ) -> np.ndarray:
        """Log-probs f32[N, L] of `labels[i]` after `seqs[i]`, packed into prefix batches.

        Each batch is dispatched before the next is built, so host packing overlaps the device.
        """
        width = max(len(lab) for lab in labels)
        out = np.zeros((len(seqs), width), np.float32)
        pending = None
        for batch in batching.batches(
            seqs, labels, token_budget=self.token_budget, buckets=self.buckets
        ):
            running = (self.program.run(batch.inputs), batch.order)
            if pending is not None:
                _collect(out, *pending)
            pending = running
        _collect(out, *pending)
        return out


def _collect(out: np.ndarray, result: jax.Array, order: list[int]) -> None:
    result = np.asarray(result)  # f32[S_bucket, L_bucket]
    width = min(result.shape[1], out.shape[1])
    out[order, :width] = result[: len(order), :width]


def check_language_model(cfg) -> None:
    """InvalidInput unless the model has a language-model head: label-token scores need one."""
    if cfg.num_labels:
        kind = f" (a {cfg.family} cross-encoder)" if cfg.bidirectional else ""
        raise InvalidInput(
            "label_token_ids",
            f"this model has a sequence-classification head of {cfg.num_labels} label(s){kind}, "
            "not a language-model head: label-token scores are unavailable (rerank works)",
        )


def scores_from_logprobs(logprobs: np.ndarray, *, apply_softmax: bool) -> np.ndarray:
    """`exp(logprob)`, or the softmax over the labels (f64 for exactness at tiny probabilities)."""
    lp = logprobs.astype(np.float64)
    if apply_softmax:
        lp = lp - lp.max(axis=1, keepdims=True)
        return np.exp(lp) / np.exp(lp).sum(axis=1, keepdims=True)
    return np.exp(lp)


def relevance(outputs: np.ndarray, *, num_labels: int, raw: bool) -> np.ndarray:
    """Each document's relevance f64[N] from its score-row outputs f32[N, L].

    A language-model head (`num_labels` 0) gives the yes/no log-probs: P(yes) / (P(yes) +
    P(no)), or raw their difference, the logit. A classification head gives logits: one label's
    sigmoid (raw: the logit), or of several the softmax of the last (raw: its logit).
    """
    x = outputs.astype(np.float64)
    if num_labels == 0:
        return x[:, 0] - x[:, 1] if raw else scores_from_logprobs(x, apply_softmax=True)[:, 0]
    if raw:
        return x[:, -1]
    if num_labels == 1:
        return 1.0 / (1.0 + np.exp(-x[:, 0]))
    return scores_from_logprobs(x, apply_softmax=True)[:, -1]
