"""Query/document pairs as a cross-encoder reads them, tokenised exactly as sentence-transformers'
`CrossEncoder` does: the two texts encoded as a pair by the model's own tokenizer (its special
tokens and separators, token type ids), truncated "longest_first" to the model's max length
(tokens come off the longer text first), at the end of each text unless told otherwise.

A model with several token types gets ids coded `type * vocab_size + id`, which the encoder's
embedding splits again (`engine.models.encoder.embed`): the packed batch carries one id per
token, whatever the model. An embedder's texts, each alone, are encoded natively where the
tokenizer allows (`engine.text.native_tokenizer`); those over the limit are cut by `tokenizers`.
"""

from collections.abc import Sequence
from typing import NamedTuple

import msgspec
import tokenizers

from engine.errors import InputTooLarge, InvalidInput
from engine.host import inputs
from engine.text import native_tokenizer

MAX_CUTTERS = 16  # truncating tokenizers kept, by limit and side


class Framing(msgspec.Struct, frozen=True, kw_only=True):
    """How each text encoded alone is framed once tokenised (a ColBERT query's or document's):
    `marker` put after its first token, within the limit; then padded with `pad_id` to
    `pad_to` tokens (0: not), the pads seen by no token where `hide_pads`."""

    marker: int | None = None
    pad_to: int = 0
    pad_id: int = 0
    hide_pads: bool = False

    def frame(self, ids: Sequence[int]) -> tuple[list[int], int]:
        """A text's framed ids, and how many of them are not padding."""
        ids = list(ids)
        if self.marker is not None:
            ids = ids[:1] + [self.marker] + ids[1:]
        real = len(ids)
        return ids + [self.pad_id] * (self.pad_to - real), real


class PairOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How a score request's items are encoded for an encoder: as pairs with its query (a
    cross-encoder's), or each by itself (an embedder's texts: `engine.kinds.Output.of_texts`);
    truncated to `limit` tokens, cutting each text's end ("right") or start ("left"), or (not
    `truncate`) refused over it."""

    limit: int
    side: str = "right"
    truncate: bool = True
    # a pair's item keeps at most this many of its own tokens (its first, or with side "left"
    # its last) before the pair is held to `limit`; None: all (a rerank's `max_tokens_per_doc`)
    item_limit: int | None = None
    framing: Framing | None = None  # texts alone: how each is framed (None: as tokenised)


class Encoded(NamedTuple):
    sequences: list[list[int]]  # coded ids, one per pair
    truncated: int  # tokens the truncation took off, all pairs together
    # per sequence, its first tokens every token sees (the rest are hidden padding); None: all
    visible: list[int] | None = None


class _Alone(NamedTuple):
    """A text's ids encoded alone (a list, or an int32 array from the native encoder): every
    token of type 0."""

    ids: Sequence[int]

    @property
    def type_ids(self) -> list[int]:
        return [0] * len(self.ids)


class PairEncoder:
    """Pairs of texts to coded token ids for one model (see the module docstring)."""

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        vocab_size: int,
        type_vocab_size: int,
        native: bool = True,
    ):
        self.whole = _copy(tokenizer)
        self.whole.no_truncation()
        self.texts = native_tokenizer.encoder_for(self.whole, native=native)  # texts alone
        self.vocab_size = vocab_size
        self.coded = type_vocab_size > 1
        self.id_space = vocab_size * type_vocab_size if self.coded else vocab_size  # coded ids
        self._cutters: dict[tuple[int, str], tokenizers.Tokenizer] = {}

    def encode(self, query: str, items: Sequence[str], options: PairOptions) -> Encoded:
        """Each (query, item) pair's coded ids, truncated as `options` say; InvalidInput naming
        `items[i]` for a token outside the model's vocabulary, InputTooLarge naming it for a
        pair over the limit when not cut."""
        pairs = [(query, item) for item in items]
        if options.item_limit is None:
            return self._cut(pairs, self.whole.encode_batch_fast(pairs), options)
        # each text encoded alone, the item's tokens cut, then the pair made of them exactly as
        # encoding the pair makes it (`post_process`: its truncation, special tokens, types)
        first = self.whole.encode(query, add_special_tokens=False)
        second = self.whole.encode_batch_fast(list(items), add_special_tokens=False)
        cut = sum(max(0, len(e.ids) - options.item_limit) for e in second)
        for e in second:
            e.truncate(options.item_limit, direction=options.side)
        join = lambda tok, rows: [tok.post_process(first, second[i]) for i in rows]
        encoded = self._cut(pairs, join(self.whole, range(len(pairs))), options, join)
        return encoded._replace(truncated=encoded.truncated + cut)

    def encode_alone(self, items: Sequence[str | list[int]], options: PairOptions) -> Encoded:
        """Each item encoded alone: a text as `encode_texts` encodes it, token ids as `given`;
        errors name the item's own index."""
        texts = [i for i, x in enumerate(items) if isinstance(x, str)]
        if len(texts) == len(items):
            return self.encode_texts(items, options)
        if not texts:
            return self.given(items, options)
        ids = [i for i, x in enumerate(items) if not isinstance(x, str)]
        parts = []
        for index, encode in ((texts, self.encode_texts), (ids, self.given)):
            try:
                parts.append(encode([items[i] for i in index], options))
            except InvalidInput as e:
                raise e.reindexed(index) from None
        sequences: list = [None] * len(items)
        visible: list = [None] * len(items)
        for index, part in zip((texts, ids), parts, strict=True):
            for j, i in enumerate(index):
                sequences[i] = part.sequences[j]
                visible[i] = len(part.sequences[j]) if part.visible is None else part.visible[j]
        hidden = any(p.visible is not None for p in parts)
        return Encoded(sequences, sum(p.truncated for p in parts), visible if hidden else None)

    def encode_texts(self, texts: Sequence[str], options: PairOptions) -> Encoded:
        """Each text's coded ids, encoded alone and framed as `options` say (its marker counted
        in the limit); as `encode` otherwise."""
        encodings = [_Alone(ids) for ids in self.texts.encode_batch(list(texts))]
        framing = options.framing
        if framing is None:
            return self._cut(texts, encodings, options)
        reserved = int(framing.marker is not None)
        cut = msgspec.structs.replace(options, limit=options.limit - reserved)
        sequences, truncated, _ = self._cut(texts, encodings, cut)
        framed = [framing.frame(ids) for ids in sequences]
        visible = [real for _, real in framed] if framing.hide_pads else None
        return Encoded([ids for ids, _ in framed], truncated, visible)

    def _cut(self, inputs: Sequence, encodings: list, options: PairOptions, encode=None) -> Encoded:
        """The `encodings` of `inputs` (pairs, or texts), those over the limit encoded again by
        `encode(truncating tokenizer, indices)` (by default of `inputs` themselves)."""
        over = [i for i, e in enumerate(encodings) if len(e.ids) > options.limit]
        truncated = 0
        if over:
            if not options.truncate:
                i = over[0]
                raise InputTooLarge(
                    f"items[{i}]",
                    f"{len(encodings[i].ids)} tokens exceed the model's limit of {options.limit}; "
                    "ask for truncation to cut it",
                )
            texts = 2 if isinstance(inputs[0], tuple) else 1
            least = self.whole.num_special_tokens_to_add(texts == 2) + texts  # a token of each
            if options.limit < least:
                what = "a pair" if texts == 2 else "a text"
                raise InvalidInput(
                    "max_prompt_tokens", f"{what} needs at least {least} tokens for this model"
                )
            if encode is None:
                encode = lambda tok, rows: tok.encode_batch_fast([inputs[i] for i in rows])
            for i, e in zip(over, encode(self._cutter(options), over), strict=True):
                truncated += len(encodings[i].ids) - len(e.ids)
                encodings[i] = e
        return Encoded([self._coded(i, e) for i, e in enumerate(encodings)], truncated)

    def given(self, sequences: Sequence[list[int]], options: PairOptions) -> Encoded:
        """An embedder's token-id sequences, as given (no special tokens added), cut as
        `options` say; InvalidInput or InputTooLarge naming `items[i]` as `encode`."""
        out, truncated = [], 0
        for i, ids in enumerate(sequences):
            if len(ids) > options.limit:
                if not options.truncate:
                    raise InputTooLarge(
                        f"items[{i}]",
                        f"{len(ids)} tokens exceed the model's limit of {options.limit}; "
                        "ask for truncation to cut it",
                    )
                truncated += len(ids) - options.limit
                ids = ids[: options.limit] if options.side == "right" else ids[-options.limit :]
            if min(ids) < 0 or max(ids) >= self.vocab_size:
                raise InvalidInput(
                    f"items[{i}]", f"token id outside the vocabulary [0, {self.vocab_size})"
                )
            out.append(list(ids))  # coded with token type 0: the id itself
        return Encoded(out, truncated)

    def _coded(self, index: int, e: "tokenizers.Encoding | _Alone") -> list[int]:
        inputs.check_vocabulary(e.ids, f"items[{index}]", self.vocab_size)
        if not self.coded:
            return e.ids
        return [t * self.vocab_size + i for i, t in zip(e.ids, e.type_ids, strict=True)]

    def _cutter(self, options: PairOptions) -> tokenizers.Tokenizer:
        key = (options.limit, options.side)
        if key not in self._cutters:
            if len(self._cutters) >= MAX_CUTTERS:
                self._cutters.clear()
            cutter = _copy(self.whole)
            cutter.enable_truncation(
                options.limit, strategy="longest_first", direction=options.side
            )
            self._cutters[key] = cutter
        return self._cutters[key]


def _copy(tokenizer: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    copy = tokenizers.Tokenizer.from_str(tokenizer.to_str())
    copy.no_padding()
    return copy
