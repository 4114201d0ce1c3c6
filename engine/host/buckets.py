"""The padding grid of packed batches and the limits it sets, defined once.

Every default here is the one `EngineConfig`, `load_model` and the bench use; `make_buckets` is
the one validation of a grid, and `Buckets.max_sequence` the one rule for the longest sequence
a request may hold.
"""

from typing import NamedTuple

from _native import pick_bucket
from engine.errors import InvalidInput

DEFAULT_TOKEN_BUDGET = 16384  # most real tokens in one packed batch
DEFAULT_BLOCK_SIZE = 64  # attention block (tokens); token buckets are multiples of it
# Score-row buckets of a T-token batch: T // d. One suffices: a program computes its real rows
# alone (`engine.models.rows`), so padding rows cost no compute, and the compiled grid is one
# program per token bucket.
DEFAULT_ROW_DIVISORS = (2,)
DEFAULT_LABEL_WIDTHS = (4, 32, 256)  # padded label counts; the last is the limit
# Context regions (keys read from the KV pool) grow by 4x: padding there costs a copy of keys,
# not attention work, so coarse steps keep the compiled grid small.
CONTEXT_STEP = 4
SMALLEST_CONTEXT = 1024


class Buckets(NamedTuple):
    """Padding grids. A batch's shape is (T tokens, S score rows, L labels per row).

    T comes from `tokens` (multiples of `block_size`); S from `rows_for(T)`, tied to T so that the
    compiled program grid stays small (by default one S per T); L from `label_widths`. The
    block-schedule width is fixed per T (`T // block_size`), so it is not a grid dimension.
    """

    block_size: int
    tokens: tuple[int, ...]
    row_divisors: tuple[int, ...] = DEFAULT_ROW_DIVISORS
    label_widths: tuple[int, ...] = DEFAULT_LABEL_WIDTHS
    contexts: tuple[int, ...] = (0,)  # context-region sizes C (keys from the KV pool)
    window: int = 0  # the model's sliding window: batches carry that layers' metadata too

    @property
    def max_context(self) -> int:
        """The most keys a batch may read from the KV pool."""
        return self.contexts[-1]

    def context_for(self, keys: int) -> int:
        """The context-region bucket holding `keys` keys; ValueError past `max_context`."""
        return pick_bucket(self.contexts, keys)

    def rows_for(self, tokens: int) -> tuple[int, ...]:
        """Score-row buckets of token bucket `tokens`, ascending."""
        return tuple(sorted({max(1, tokens // d) for d in self.row_divisors}))

    @property
    def max_rows(self) -> int:
        """The most score rows any batch can have."""
        return self.rows_for(self.tokens[-1])[-1]

    @property
    def max_labels(self) -> int:
        """The most label tokens one request may score."""
        return self.label_widths[-1]

    def max_sequence(self, context: int) -> int:
        """The longest query + item sequence a model of `context` positions accepts here."""
        return min(context, self.tokens[-1])

    def grid(self, max_tokens: int) -> list[tuple[int, int, int]]:
        """The (T, S, L) shapes to precompile: T <= `max_tokens`, L the smallest label width."""
        return [
            (t, s, self.label_widths[0])
            for t in self.tokens
            if t <= max_tokens
            for s in self.rows_for(t)
        ]

    def shape(self, real_tokens: int, rows: int, labels: int) -> tuple[int, int, int]:
        """The (T, S, L) of a batch of `real_tokens` tokens, `rows` sequences and `labels` labels.

        T is the smallest token bucket that holds the tokens and whose largest row bucket holds
        the rows; S the smallest of its row buckets that holds them. ValueError when nothing does.
        """
        width = self._label_width(labels)
        smallest = pick_bucket(self.tokens, real_tokens)
        for t in self.tokens[self.tokens.index(smallest) :]:
            row_buckets = self.rows_for(t)
            if row_buckets[-1] >= rows:
                return t, pick_bucket(row_buckets, rows), width
        raise ValueError(f"score rows {rows} exceeds the largest bucket {self.max_rows}")

    def _label_width(self, labels: int) -> int:
        if labels > self.label_widths[-1]:
            raise ValueError(
                f"{labels} labels per sequence exceed the largest label width "
                f"{self.label_widths[-1]}"
            )
        return pick_bucket(self.label_widths, labels)


def default_buckets(max_tokens: int, block_size: int = DEFAULT_BLOCK_SIZE) -> Buckets:
    """Token buckets from `2 * block_size` up to covering `max_tokens`.

    Powers of two up to 1024 tokens, then four per octave (P, 5P/4, 3P/2, 7P/4), so a large batch
    pads by at most a fifth and usually by far less; small batches are cheap either way. Each
    bucket is a multiple of `block_size`.
    """
    tokens = [block_size * 2]
    while tokens[-1] < max_tokens:
        last = tokens[-1]
        octave = 1 << (last.bit_length() - 1)  # the power of two at or below `last`
        step = octave // 4 if octave >= 1024 else octave
        tokens.append(-(-(last + step) // block_size) * block_size)
    return Buckets(block_size, tuple(tokens))


def make_buckets(
    context: int,
    *,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    block_size: int = DEFAULT_BLOCK_SIZE,
    token_buckets: tuple[int, ...] | None = None,
    row_divisors: tuple[int, ...] = DEFAULT_ROW_DIVISORS,
    label_widths: tuple[int, ...] = DEFAULT_LABEL_WIDTHS,
    window: int = 0,
) -> Buckets:
    """The grid for a model of `context` positions (and sliding `window`, 0: none):
    `token_buckets`, or by default buckets up to the larger of the budget and the context.
    InvalidInput naming the inconsistent field."""
    if token_budget < 1:
        raise InvalidInput("token_budget", "must be a positive integer")
    if block_size < 1:
        raise InvalidInput("block_size", "must be a positive integer")
    tokens = token_buckets or default_buckets(max(token_budget, context), block_size).tokens
    if list(tokens) != sorted(set(tokens)) or any(t <= 0 or t % block_size for t in tokens):
        raise InvalidInput(
            "token_buckets", f"must be ascending multiples of block_size {block_size}"
        )
    if tokens[-1] < token_budget:
        raise InvalidInput("token_buckets", f"the largest ({tokens[-1]}) is below token_budget")
    for name, values in (("row_divisors", row_divisors), ("label_widths", label_widths)):
        if not values or any(v < 1 for v in values):
            raise InvalidInput(name, "must be positive integers")
    return Buckets(
        block_size,
        tuple(tokens),
        tuple(row_divisors),
        tuple(sorted(label_widths)),
        context_buckets(max(context, 2 * token_budget), block_size),
        window,
    )


def context_buckets(keys: int, block_size: int = DEFAULT_BLOCK_SIZE) -> tuple[int, ...]:
    """Context-region sizes: 0, then multiples of `block_size` from `SMALLEST_CONTEXT` growing
    `CONTEXT_STEP`-fold until one holds `keys` (by default the larger of a whole sequence of the
    model's context and two budgets' worth: the cached prefixes of one batch's groups)."""
    sizes = [0, -(-SMALLEST_CONTEXT // block_size) * block_size]
    while sizes[-1] < keys:
        sizes.append(sizes[-1] * CONTEXT_STEP)
    return tuple(sizes)
