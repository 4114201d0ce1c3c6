"""The offline scoring API: `load_model(...)` and `ScoringModel.score(...)`."""

import functools
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import tokenizers

from engine import inputs, packing
from engine.loaders import Checkpoint, load_checkpoint
from engine.models import FAMILIES, ModelConfig, PackedInputs, label_logprobs
from engine.models.decoder import pack_layers
from kernels import select_attention, select_dense

DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}
DEFAULT_TOKEN_BUDGET = 16384


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
    picks "cpu" for bf16 on a CPU that runs it; `token_budget` bounds the tokens of one packed
    batch; `progress` shows a loading bar.
    """
    return ScoringModel(
        load_checkpoint(path, progress=progress),
        dtype=dtype,
        attention=attention,
        dense=dense,
        token_budget=token_budget,
    )


F32_PARAMS = frozenset(
    {"attn_norm", "mlp_norm", "final_norm", "q_norm", "k_norm", "bq", "bk", "bv"}
)


def place_params(params: dict, dtype) -> dict:
    """Device copies of host params: matrices in `dtype`, norms and biases kept in f32."""
    return {
        name: place_params(a, dtype)
        if isinstance(a, dict)
        else jnp.asarray(a, jnp.float32 if name in F32_PARAMS else dtype)
        for name, a in params.items()
    }


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
        if dtype not in DTYPES:
            raise ValueError(f"dtype: {dtype!r} is not one of {sorted(DTYPES)}")
        self.config: ModelConfig = checkpoint.config
        self.tokenizer: tokenizers.Tokenizer = checkpoint.tokenizer
        self.dtype = dtype
        self.token_budget = token_budget
        self.buckets = packing.default_buckets(
            max(token_budget, self.config.max_position_embeddings)
        )
        self.dense = select_dense(dense, jax.default_backend(), dtype=DTYPES[dtype])
        self.params = place_params(checkpoint.params, DTYPES[dtype])
        if self.dense == "cpu":
            self.params = pack_layers(self.params)
        self.attention = select_attention(
            attention,
            jax.default_backend(),
            head_dim=self.config.head_dim,
            dtype=DTYPES[dtype],
        )
        self._forward = jax.jit(
            functools.partial(
                label_logprobs,
                cfg=self.config,
                family=FAMILIES[self.config.family],
                attention=self.attention,
            )
        )

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
        labels = inputs.check_labels(label_token_ids, self.config.vocab_size)
        seqs = self.sequences(query, items, item_first=item_first)
        logprobs = self.label_logprobs(seqs, [labels] * len(seqs))  # f32[N, L]
        return scores_from_logprobs(logprobs, apply_softmax=apply_softmax).tolist()

    def sequences(self, query: inputs.Query, items: inputs.Items, *, item_first: bool):
        """The validated token sequences `score` would run, one per item."""
        seqs = inputs.build_sequences(self.tokenizer, query, items, item_first=item_first)
        if not isinstance(query, str):  # built: the query's ids are ints
            inputs.check_query_ids(query, self.config.vocab_size)
        inputs.check_sequences(
            seqs, vocab_size=self.config.vocab_size, max_len=self.config.max_position_embeddings
        )
        return seqs

    def compile(self, batch: PackedInputs) -> None:
        """Compile the program for `batch`'s shapes without running it; later calls reuse it."""
        self._forward.lower(self.params, batch).compile()

    def run_batch(self, batch: PackedInputs) -> jax.Array:
        """Dispatch one packed batch; its label log-probs f32[S, L] are computed asynchronously."""
        return self._forward(self.params, batch)

    def label_logprobs(
        self, seqs: Sequence[Sequence[int]], labels: Sequence[Sequence[int]]
    ) -> np.ndarray:
        """Log-probs f32[N, L] of `labels[i]` after `seqs[i]`, packed into prefix batches.

        Each batch is dispatched before the next is built, so host packing overlaps the device.
        """
        width = max(len(lab) for lab in labels)
        out = np.zeros((len(seqs), width), np.float32)
        pending = None
        for plan in packing.plan(seqs, token_budget=self.token_budget, buckets=self.buckets):
            batch, order = packing.pack(seqs, labels, plan, self.buckets)
            running = (self.run_batch(batch), order)
            if pending is not None:
                _collect(out, *pending)
            pending = running
        _collect(out, *pending)
        return out


def _collect(out: np.ndarray, result: jax.Array, order: list[int]) -> None:
    result = np.asarray(result)  # f32[S_bucket, L_bucket]
    width = min(result.shape[1], out.shape[1])
    out[order, :width] = result[: len(order), :width]


def scores_from_logprobs(logprobs: np.ndarray, *, apply_softmax: bool) -> np.ndarray:
    """`exp(logprob)`, or the softmax over the labels (f64 for exactness at tiny probabilities)."""
    lp = logprobs.astype(np.float64)
    if apply_softmax:
        lp = lp - lp.max(axis=1, keepdims=True)
        return np.exp(lp) / np.exp(lp).sum(axis=1, keepdims=True)
    return np.exp(lp)
