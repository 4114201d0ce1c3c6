"""Tokenizer actor: validates score requests and turns them into token sequences.

Everything pending is encoded in one batch call in a worker thread, so the loop stays live (a
batch small enough that the thread's round trip would cost more is encoded on the loop): in
native code where the tokenizer is one `engine.text.native_tokenizer` equals, else by `tokenizers`'
`encode_batch_fast` (the ids without character offsets, which nothing here reads); token ids
are cached by text (bounded LRU). A cross-encoder's pair requests are encoded as pairs, an
embedder's texts each alone (`engine.host.pairs`), one call per request. A bad request fails alone
with a `Rejected`. A `Cancel` is passed on in its place among the requests, so it always
follows its request.
"""

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import msgspec
import numpy as np
import tokenizers
import trio

from engine.channels import drain
from engine.errors import InputTooLarge, InvalidInput, rejection_error, rejection_kind
from engine.host import inputs
from engine.host.buckets import Buckets
from engine.host.pairs import Encoded, PairEncoder
from engine.kinds import Output
from engine.messages import Cancel, Rejected, ScoreRequest, Tokenized
from engine.tasks import Task
from engine.text import native_tokenizer

MAX_DRAIN = 256  # requests tokenised together at most; bounds one worker-thread call
# Requests of at most this many characters or ids in all are tokenised on the event loop: tens
# of microseconds, where handing them to a worker thread and back costs 0.1-0.2 ms.
INLINE_WORK = 2048


class TokenCache:
    """Bounded LRU of text -> token ids, counting hits and misses."""

    def __init__(self, size: int):
        self.size = size
        self.entries: OrderedDict[str, Sequence[int]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, text: str) -> Sequence[int] | None:
        ids = self.entries.get(text)
        if ids is None:
            self.misses += 1
            return None
        self.hits += 1
        self.entries.move_to_end(text)
        return ids

    def put(self, text: str, ids: Sequence[int]) -> None:
        """Keep `ids` for `text` (a cache of size 0 keeps nothing); an array is copied, so that
        a view does not keep its whole batch's buffer alive."""
        if not self.size:
            return
        self.entries[text] = ids.copy() if isinstance(ids, np.ndarray) else ids
        self.entries.move_to_end(text)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)


class TokenizerState:
    """Validation and tokenisation of score requests with `ScoringModel.score` semantics."""

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        vocab_size: int,
        max_len: int,
        max_items: int | None,
        max_labels: int,
        cache_size: int,
        pairs: PairEncoder | None = None,
        max_token_vectors: int | None = None,
        native: bool = True,
        row_labels: Callable[[Output, list[int]], list[int]] = lambda output, labels: labels,
    ):
        self.tokenizer = tokenizer
        # joined query+item texts; a pair model encodes its texts in `pairs`, natively there,
        # so it is not built twice
        self.encoder = native_tokenizer.encoder_for(tokenizer, native=native and pairs is None)
        self.vocab_size = vocab_size
        # every id the tokenizer can give is the model's: its texts' ids need no check
        ids = tokenizer.get_vocab(with_added_tokens=True).values()
        self.text_ids_fit = max(ids, default=-1) < vocab_size
        self.max_len = max_len
        self.max_items = max_items
        self.max_labels = max_labels
        self.max_token_vectors = max_token_vectors  # tokens a per-token request may answer
        self.cache = TokenCache(cache_size)
        self.pairs = pairs  # a cross-encoder's pair tokenisation; None: pairs are refused
        self.row_labels = row_labels  # the labels a row reads for an output (`Task.row_labels`)

    @classmethod
    def for_model(
        cls,
        tokenizer: tokenizers.Tokenizer,
        task: Task,
        buckets: Buckets,
        *,
        max_items: int | None,
        cache_size: int,
        max_token_vectors: int | None = None,
        native: bool = True,
    ) -> "TokenizerState":
        """The state for a model of `task` batched on `buckets`: the longest sequence and the
        label count those allow (`Buckets.max_sequence`, `Buckets.max_labels`), the task's
        pair tokenisation (a cross-encoder's), and texts encoded natively where `native` and the
        tokenizer allow (`engine.text.native_tokenizer`)."""
        config = task.config
        return cls(
            tokenizer,
            vocab_size=config.vocab_size,
            max_len=buckets.max_sequence(config.max_position_embeddings),
            max_items=max_items,
            max_labels=buckets.max_labels,
            cache_size=cache_size,
            pairs=task.pair_encoder(tokenizer, native=native),
            max_token_vectors=max_token_vectors,
            native=native,
            row_labels=task.row_labels,
        )

    def tokenize(self, request: ScoreRequest) -> Tokenized:
        """`process` of one request, in the caller's thread; its rejection raised as the error
        it names (InvalidInput naming the field, ...)."""
        (out,) = self.process([request])
        if isinstance(out, Rejected):
            raise rejection_error(out.kind, out.message, out.field)
        return out

    def process(self, requests: list[ScoreRequest | Cancel]) -> list[Tokenized | Rejected | Cancel]:
        """One message per message, in order; all new texts encoded in one batch call."""
        start = time.perf_counter()
        staged = [r if isinstance(r, Cancel) else self._stage(r) for r in requests]
        texts = dict.fromkeys(  # unique, in request order
            t for s in staged if isinstance(s, list) for t in s if isinstance(t, str)
        )
        encoded = self._encode(texts)
        return [self._finish(r, s, encoded, start) for r, s in zip(requests, staged, strict=True)]

    def _stage(self, r: ScoreRequest) -> list | Rejected:
        """The texts (str) or id sequences (list) of a request, or why it is rejected."""
        try:
            items = inputs.normalize_items(r.items, self.max_items)
            labels = self._labels(r)
            if len(labels) > self.max_labels:
                raise InputTooLarge(
                    "label_token_ids", f"{len(labels)} labels exceed the limit of {self.max_labels}"
                )
            if r.pairs is not None:
                return self._pairs(r, items)
            if inputs.is_text_request(r.query, items):
                return inputs.texts_to_join(r.query, items, item_first=r.item_first)
            return inputs.join_ids(
                r.query, items, item_first=r.item_first, vocab_size=self.vocab_size
            )
        except InvalidInput as e:
            return _rejected(r.id, e)

    def _pairs(self, r: ScoreRequest, items: list) -> Encoded:
        if self.pairs is None:
            raise InvalidInput("query/items", "this model does not score text pairs")
        options = msgspec.structs.replace(r.pairs, limit=min(r.pairs.limit, self.max_len))
        if r.output.of_texts:
            return self.pairs.encode_alone(items, options)
        if not (isinstance(r.query, str) and all(isinstance(it, str) for it in items)):
            raise InvalidInput("query/items", "a pair's query and items must be text")
        return self.pairs.encode(r.query, items, options)

    def _labels(self, r: ScoreRequest) -> list[int]:
        """The labels read at each score row for the request's output: the caller's (and the
        normaliser for a language model's logits: `Task.row_labels`); none for texts embedded
        (a row's output is its vector)."""
        if r.output.of_texts:
            return []
        return self.row_labels(r.output, inputs.check_labels(r.label_token_ids, self.vocab_size))

    def _encode(self, texts) -> dict[str, Sequence[int]]:
        """Ids for every text: cached ones, and the rest encoded in one batch call."""
        found = {t: self.cache.get(t) for t in texts}
        missing = [t for t, ids in found.items() if ids is None]
        for text, ids in zip(missing, self.encoder.encode_batch(missing), strict=True):
            found[text] = ids
            self.cache.put(text, ids)
        return found

    def _check_token_vectors(self, seqs) -> None:
        """InputTooLarge naming `items` when a request asks for more token vectors than
        one request may (each is a row of floats in its answer)."""
        tokens, limit = sum(map(len, seqs)), self.max_token_vectors
        if limit is not None and tokens > limit:
            why = f"{tokens} tokens' vectors exceed the limit of {limit} per request"
            raise InputTooLarge("items", why)

    def _finish(self, r, staged, encoded, start: float) -> Tokenized | Rejected | Cancel:
        """The request's sequences, checked; its tokenize time counts from `start` (the batch
        call's) to the end of its own checks."""
        if isinstance(staged, Rejected | Cancel):
            return staged
        truncated, id_space = 0, None if self.text_ids_fit else self.vocab_size
        visible = None
        if isinstance(staged, Encoded):
            (staged, truncated, visible), id_space = staged, self.pairs.id_space
        elif staged and not isinstance(staged[0], str):
            id_space = None  # ids the caller gave, checked before they were joined (`_stage`)
        seqs = [encoded[s] if isinstance(s, str) else s for s in staged]
        try:
            inputs.check_sequences(seqs, vocab_size=id_space, max_len=self.max_len)
            if r.output.per_token:
                self._check_token_vectors(seqs)
        except InvalidInput as e:
            return _rejected(r.id, e)
        return Tokenized(
            id=r.id,
            sequences=seqs,
            labels=self._labels(r),
            arrived=r.arrived,
            tokenize_s=time.perf_counter() - start,
            truncated=truncated,
            output=r.output,
            visible=visible,
        )


def _rejected(request_id: int, error: InvalidInput) -> Rejected:
    kind = rejection_kind(error)
    return Rejected(id=request_id, kind=kind, message=error.detail, field=error.field)


async def run(
    state: TokenizerState,
    receive: trio.MemoryReceiveChannel,
    send: trio.MemorySendChannel,
    *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Tokenise requests as they come, batching whatever queued up meanwhile; pass cancellations
    on in order.

    `send` must be unbounded: a drained batch is handed over whole, without a checkpoint between
    messages, so the scheduler sees every request of a burst before it forms the next batch.
    """
    task_status.started()
    async for first in receive:
        pending = drain(receive, first, MAX_DRAIN)
        if _small(pending):
            done = state.process(pending)
        else:
            done = await trio.to_thread.run_sync(state.process, pending)
        for message in done:
            send.send_nowait(message)


def _small(messages: list) -> bool:
    """Whether the requests' queries (once per item) and items hold at most `INLINE_WORK`
    characters or ids in all: counted until the budget is spent, never raising on a malformed
    request (`process` rejects it)."""
    budget = INLINE_WORK
    for r in messages:
        if not isinstance(r, ScoreRequest):
            continue
        items = [r.items] if isinstance(r.items, str) else r.items
        if not isinstance(items, list | tuple) or len(items) > budget:
            return False
        query = _size(r.query)
        for item in items:
            budget -= query + _size(item)
            if budget < 0:
                return False
    return True


def _size(x: object) -> int:
    return len(x) if isinstance(x, str | list | tuple) else 0
