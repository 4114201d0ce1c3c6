"""Byte-level BPE texts encoded in native code (`_native._byte_bpe`), equal to `tokenizers`.

`NativeTokenizer.wrap(tokenizer)` accepts a `tokenizers.Tokenizer` the native encoder reproduces
exactly, and answers None for any other:
- a BPE model without dropout, byte fallback or word affixes, whose vocabulary spells every
  byte or has no unknown token (a byte without one is dropped, as there);
- GPT-2's byte-level pre-tokenizer, or a split on the Qwen2 or Llama 3 regex then byte-level;
- no normaliser, or NFC (then only ASCII texts, which NFC leaves alone, are encoded natively);
- no truncation or padding; a post-processor whose added ids are the same for every text.

Per text, the reference still encodes what the native path cannot prove equal: a text holding an
added token's content, and one with a code point the reference's regex engine cannot take (a
lone surrogate), so that it fails as before. Code point classes (letter, number, whitespace,
other) are learnt from the reference's own regex engine the first time a code point is seen.
"""

import json
import os
from collections.abc import Sequence

import tokenizers
from tokenizers import Regex, pre_tokenizers

from engine.text.byte_level import BYTE_ALPHABET, LLAMA3_SPLIT, QWEN2_SPLIT

try:
    from _native import _byte_bpe
except ImportError:  # not built: the reference encodes every text
    _byte_bpe = None

# class codes of `byte_bpe::Class`, with the reference regex that decides each
_PROBES = ((1, r"\p{L}"), (2, r"\p{N}"), (3, r"\s"))
_OTHER = 4
_SPLITS = {QWEN2_SPLIT: "qwen2", LLAMA3_SPLIT: "llama3"}
_SURROGATES = range(0xD800, 0xE000)


# threads a large batch's texts are shared out to: this process's cores, at most 8
THREADS = min(8, len(os.sched_getaffinity(0)))


class ReferenceTokenizer:
    """`encode_batch(texts)` by `tokenizers` itself."""

    def __init__(self, tokenizer: tokenizers.Tokenizer):
        self.tokenizer = tokenizer

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.tokenizer.encode_batch_fast(texts)]


def encoder_for(
    tokenizer: tokenizers.Tokenizer, *, native: bool = True
) -> "NativeTokenizer | ReferenceTokenizer":
    """The native encoder of `tokenizer` where `native` and `NativeTokenizer.wrap` allow, else
    the reference."""
    found = NativeTokenizer.wrap(tokenizer) if native else None
    return found or ReferenceTokenizer(tokenizer)


class NativeTokenizer:
    """`encode_batch(texts)`: each text's ids, as `tokenizer.encode_batch_fast(texts)` gives
    them."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, encoder, *, ascii_only: bool, added):
        self.tokenizer = tokenizer
        self.encoder = encoder
        self.ascii_only = ascii_only  # an NFC normaliser: other texts go to the reference
        self.added = tuple(added)  # added tokens' contents: a text holding one goes there too
        self.added_starts = frozenset(a[0] for a in self.added)
        self.known: set[str] = set()  # characters whose class the encoder has
        self.learn("".join(map(chr, range(128))))
        self.prefix, self.suffix = _special_ids(tokenizer, encoder)

    @classmethod
    def wrap(cls, tokenizer: tokenizers.Tokenizer) -> "NativeTokenizer | None":
        """The native form of `tokenizer`, or None where it is not one the encoder equals (or
        the native module is not built)."""
        if _byte_bpe is None or tokenizer.truncation or tokenizer.padding:
            return None
        if not isinstance(tokenizer.model, tokenizers.models.BPE):
            return None  # asked before the whole tokenizer is written out
        spec = json.loads(tokenizer.to_str())
        pattern = _pattern(spec.get("pre_tokenizer"))
        normalizer = spec.get("normalizer")
        model = spec.get("model") or {}
        tables = _tables(model)
        if pattern is None or tables is None or normalizer not in (None, {"type": "NFC"}):
            return None
        added = [t["content"] for t in spec.get("added_tokens") or [] if t["content"]]
        encoder = _byte_bpe.ByteLevelBPE(pattern, *tables)
        if model.get("ignore_merges"):
            vocab = model["vocab"].items()  # an entry out of the byte alphabet matches no piece
            encoder.ignore_merges((_bytes(t), i) for t, i in vocab if set(t) <= _BYTE_OF.keys())
        try:
            return cls(tokenizer, encoder, ascii_only=normalizer is not None, added=added)
        except _PostProcessorVaries:
            return None

    def encode_batch(self, texts: list[str]) -> list[Sequence[int]]:
        """Ids of each text, special tokens added as the reference adds them: int32 views into
        one buffer where encoded natively, lists where the reference encoded the text."""
        out: list = [None] * len(texts)
        native = [i for i, text in enumerate(texts) if self._native(text)]
        self._encode(texts, native, out)
        rest = [i for i, ids in enumerate(out) if ids is None]
        if rest:
            reference = ReferenceTokenizer(self.tokenizer).encode_batch([texts[i] for i in rest])
            for i, ids in zip(rest, reference, strict=True):
                out[i] = ids
        return out

    def learn(self, text: str) -> None:
        """Give the encoder the class of each new character of `text` (lone surrogates stay
        unknown: the reference refuses them)."""
        new = "".join(c for c in set(text) - self.known if ord(c) not in _SURROGATES)
        if not new:
            return
        classes = [_OTHER] * len(new)
        for code, pattern in _PROBES:
            for i in _matches(pattern, new):
                classes[i] = code
        self.encoder.set_classes([ord(c) for c in new], classes)
        self.known.update(new)

    def _native(self, text: str) -> bool:
        if self.ascii_only and not text.isascii():
            return False
        return not any(s in text for s in self.added_starts) or not any(
            a in text for a in self.added
        )

    def _encode(self, texts: list[str], which: list[int], out: list) -> None:
        """Native ids into `out` at `which`; a text with a character of unknown class is
        encoded again once its classes are learnt."""
        for attempt in range(2):
            batch = [texts[i] for i in which]
            ids = self.encoder.encode_batch(batch, self.prefix, self.suffix, THREADS)
            unknown = []
            for i, found in zip(which, ids, strict=True):
                if found is None:
                    unknown.append(i)
                else:
                    out[i] = found
            if not unknown or attempt:
                return
            for i in unknown:
                self.learn(texts[i])
            which = unknown


class _PostProcessorVaries(Exception):
    """The post-processor's added ids are not one prefix and suffix around the text's own."""


def _special_ids(tokenizer: tokenizers.Tokenizer, encoder) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after every text's own, read off probes."""
    found = set()
    for probe in ("a", "a b"):
        whole = tokenizer.encode_batch_fast([probe])[0].ids
        own = encoder.encode_batch([probe])[0].tolist()
        n = len(own)
        at = [k for k in range(len(whole) - n + 1) if whole[k : k + n] == own]
        if len(at) != 1:
            raise _PostProcessorVaries
        found.add((tuple(whole[: at[0]]), tuple(whole[at[0] + n :])))
    if len(found) != 1:
        raise _PostProcessorVaries
    ((prefix, suffix),) = found
    if tokenizer.encode_batch_fast([""])[0].ids != [*prefix, *suffix]:
        raise _PostProcessorVaries
    return list(prefix), list(suffix)


def _pattern(pre: dict | None) -> str | None:
    """The encoder's pattern name for a pre-tokenizer spec, or None."""
    if pre is None:
        return None
    if pre.get("type") == "ByteLevel":
        return "gpt2" if pre.get("use_regex", True) and not pre.get("add_prefix_space") else None
    if pre.get("type") != "Sequence" or len(pre.get("pretokenizers", [])) != 2:
        return None
    split, byte_level = pre["pretokenizers"]
    plain = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
    if any(byte_level.get(k) != v for k, v in plain.items()):
        return None
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert"):
        return None
    return _SPLITS.get((split.get("pattern") or {}).get("Regex"))


def _tables(model: dict):
    """(byte ids i32[256], merges as (left, right, merged) rows), or None for a model the
    encoder does not equal."""
    if model.get("type") != "BPE" or model.get("dropout") or model.get("byte_fallback"):
        return None
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    vocab = model.get("vocab") or {}
    byte_ids = [vocab.get(BYTE_ALPHABET[b], -1) for b in range(256)]
    if -1 in byte_ids and model.get("unk_token") is not None:
        return None  # an unknown byte becomes the unknown token: not done natively
    merges = []
    for merge in model.get("merges") or []:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        merged = vocab.get(left + right)
        if left not in vocab or right not in vocab or merged is None:
            return None
        merges.append((vocab[left], vocab[right], merged))
    return byte_ids, merges


def _bytes(token: str) -> bytes:
    """The bytes a vocabulary entry spells in the byte alphabet."""
    return bytes(_BYTE_OF[c] for c in token)


_BYTE_OF = {char: byte for byte, char in BYTE_ALPHABET.items()}


def _matches(pattern: str, text: str) -> list[int]:
    """Indices of the characters of `text` the reference's regex engine matches with
    `pattern` (one character wide)."""
    kept = pre_tokenizers.Split(Regex(pattern), behavior="removed").pre_tokenize_str(text)
    outside = {i for _, (start, end) in kept for i in range(start, end)}
    return [i for i in range(len(text)) if i not in outside]
