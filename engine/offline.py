"""The synchronous front door: `load_model(...)` and `ScoringModel`, for scripts and notebooks.

A `ScoringModel` is a thin front over the very engine `open_engine` runs (`engine.engine_thread`):
the same `EngineConfig`, actors, request building, checks and answers, in a trio loop of its
own thread; each method is a blocking call into it. The two doors cannot disagree.
"""

import weakref
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np
import tokenizers
import trio

from engine.config import EngineConfig
from engine.device.program import DeviceProgram
from engine.engine import Engine
from engine.engine_thread import EngineThread
from engine.host import inputs
from engine.messages import ScoreRequest
from engine.models import ModelConfig
from engine.results import HybridEmbedResult, SparseVector

# where `load_model` starts from other than `EngineConfig()`: no bucket grid compiled ahead (a
# program compiles when a batch first needs it), no KV pool (no prefix reuse across calls, no
# chunked prefill), no wait for other callers' requests
OFFLINE = EngineConfig(precompile=False, kv_cache_bytes=0, batch_linger_ms=0.0)


def load_model(
    path: str | Path | None = None, *, config: EngineConfig | None = None, **options
) -> "ScoringModel":
    """Load a checkpoint (a `.gguf` file or a Hugging Face directory; `None` is the default
    model) behind a synchronous `ScoringModel`.

    `options` are `EngineConfig` fields over `config` (by default `OFFLINE`): `dtype`
    ("bfloat16", "float32" or "int8"), `attention` and `dense` (forced implementations by name;
    None picks the fastest here), `token_budget` (tokens of one packed batch), `progress` (the
    loading bar), and every other knob of the engine. Errors name the field (`dtype: ...`);
    TypeError for a name that is no field.
    """
    config = config or OFFLINE
    if path is not None:
        options["model"] = str(path)
    for name in options:
        if name not in EngineConfig.__struct_fields__:
            raise TypeError(f"load_model: {name!r} is not an EngineConfig field")
    return ScoringModel(msgspec.structs.replace(config, **options))


class ScoringModel:
    """A loaded model, called synchronously: `score`, `rerank`, `embed`, `embed_tokens` answer
    exactly what the `Engine` methods of the same names answer (`Engine` documents each), as
    plain lists and arrays. `close()` (or the end of a `with` block, or of the process) shuts
    its engine down."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self._thread = EngineThread(config)
        weakref.finalize(self, self._thread.close)
        self.engine: Engine = self._thread.engine
        self.program: DeviceProgram = self.engine.program
        self.task = self.engine.task
        self.tokenizer: tokenizers.Tokenizer = self.engine.tokenizer

    @property
    def model_config(self) -> ModelConfig:
        """The architecture of the loaded model."""
        return self.engine.model_config

    @property
    def dtype(self) -> str:
        return self.program.dtype

    def close(self) -> None:
        self._thread.close()

    def __enter__(self) -> "ScoringModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def score(
        self,
        query: inputs.Query,
        items: inputs.Items,
        label_token_ids: Sequence[int],
        *,
        apply_softmax: bool = False,
        item_first: bool = False,
    ) -> list[list[float]]:
        """Per item, the probability of each label token at the end of `query + item`: each
        `exp(logprob)` under the full vocabulary, or with `apply_softmax` the softmax over the
        labels (SGLang's `/v1/score`; `Engine.score`)."""
        options = dict(apply_softmax=apply_softmax, item_first=item_first)
        return self._thread.call(self.engine.score, query, items, label_token_ids, **options).scores

    def rerank(self, query: str, documents: Sequence[str], **options) -> list[float]:
        """Each document's relevance to `query`, in document order, exactly as `Engine.rerank`
        scores it with the same `options` (but `top_n`); no documents, no relevances."""
        if isinstance(documents, list | tuple) and not documents:
            return []
        ranked = self._thread.call(self.engine.rerank, query, documents, **options)
        scores = [0.0] * len(documents)
        for hit in ranked.results:
            scores[hit.index] = hit.relevance_score
        return scores

    def embed(self, texts: Sequence[str] | Sequence[Sequence[int]], **options) -> np.ndarray:
        """One vector per text, f32[N, D], as `Engine.embed` computes it with the same
        `options`."""
        return self._thread.call(self.engine.embed, texts, **options).embeddings

    def embed_tokens(
        self, texts: Sequence[str] | Sequence[Sequence[int]], **options
    ) -> list[np.ndarray]:
        """Every token's vector f32[n, E] of each text, as `Engine.embed_tokens` computes it
        with the same `options`."""
        return self._thread.call(self.engine.embed_tokens, texts, **options).embeddings

    def embed_sparse(
        self, texts: Sequence[str] | Sequence[Sequence[int]], **options
    ) -> list[SparseVector]:
        """A SPLADE model's sparse vector `(indices i32[k], values f32[k])` of each text, as
        `Engine.embed_sparse` computes it with the same `options` (`max_active_dims` keeps each
        one's largest entries)."""
        return self._thread.call(self.engine.embed_sparse, texts, **options).embeddings

    def embed_multi(
        self, texts: Sequence[str] | Sequence[Sequence[int]], **options
    ) -> list[np.ndarray]:
        """Each text's multi-vectors f32[n, D], as `Engine.embed_multi` computes them."""
        return self._thread.call(self.engine.embed_multi, texts, **options).embeddings

    def embed_hybrid(
        self, texts: Sequence[str] | Sequence[Sequence[int]], **options
    ) -> HybridEmbedResult:
        """Any of each text's dense, sparse and multi-vectors from one forward, as
        `Engine.embed_hybrid` answers them with the same `options`."""
        return self._thread.call(self.engine.embed_hybrid, texts, **options)

    def sequences(
        self, query: inputs.Query, items: inputs.Items, *, item_first: bool = False
    ) -> list[list[int]]:
        """The validated token sequences `score` runs, one per item, exactly as the engine's
        tokenizer builds them; InvalidInput (a ValueError) naming the field otherwise."""
        request = ScoreRequest(query=query, items=items, label_token_ids=[0], item_first=item_first)
        return self._thread.call_sync(self.engine.sequences, request)

    def row_outputs(
        self, seqs: Sequence[Sequence[int]], labels: Sequence[Sequence[int]]
    ) -> np.ndarray:
        """What the score row of each token sequence `seqs[i]` answers for `labels[i]`, f32[N,
        L] (L: the most labels of any): a language model's label log-probs, a classification
        head's logits. The sequences that read one label list run as one request, the requests
        at once."""
        output = self.task.outputs[0]
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, lab in enumerate(labels):
            groups.setdefault(tuple(lab), []).append(i)
        out = np.zeros((len(seqs), max(map(len, groups), default=0)), np.float32)

        async def run(lab: tuple[int, ...], rows: list[int]) -> None:
            items = [list(seqs[i]) for i in rows]
            request = ScoreRequest(query=[], items=items, label_token_ids=list(lab), output=output)
            answers, _ = await self.engine.outputs(request)
            out[rows, : len(lab)] = answers

        async def every() -> None:
            async with trio.open_nursery() as nursery:
                for lab, rows in groups.items():
                    nursery.start_soon(run, lab, rows)

        self._thread.call(every)
        return out
