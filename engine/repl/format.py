"""The REPL's output: result tables sized to the terminal, footers, engine counters."""

import msgspec

from engine.repl.session import Score
from engine.results import RerankHit


def format_probability(p: float) -> str:
    """Nine decimals, or scientific notation below 1e-3 in size, so small values keep 7 digits."""
    return f"{p:.9f}" if abs(p) >= 1e-3 else f"{p:.6e}"


def clip(text: str, width: int) -> str:
    """One line of at most `width` characters; control characters shown escaped."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= width else text[: width - 1] + "…"


def _text_width(used: int, columns: int) -> int:
    return max(20, columns - used - 1)  # the last column never wraps on a normal terminal


def format_scores(action: Score, scores: list[list[float]], columns: int) -> str:
    """One row per item: index, the probability of each label, the item text."""
    names = [clip(n, 20) for n in action.label_names]
    widths = [max(3, len(str(len(scores) - 1))), *(max(12, len(n)) for n in names)]
    text_w = _text_width(sum(w + 2 for w in widths), columns)
    rows = [
        _row(widths, [i, *map(format_probability, row)], clip(item, text_w))
        for i, (item, row) in enumerate(zip(action.items, scores, strict=True))
    ]
    return "\n".join([_row(widths, ["#", *names], "item"), *rows])


def format_rerank(
    documents: list[str], hits: list[RerankHit], columns: int, measure: str = "relevance"
) -> str:
    """One row per returned document, best first: rank, index, its score (headed `measure`),
    document text."""
    widths = [4, max(5, len(str(len(documents) - 1))), 12]
    text_w = _text_width(sum(w + 2 for w in widths), columns)
    rows = [
        _row(
            widths,
            [rank, h.index, format_probability(h.relevance_score)],
            clip(documents[h.index], text_w),
        )
        for rank, h in enumerate(hits, 1)
    ]
    return "\n".join([_row(widths, ["rank", "index", measure], "document"), *rows])


def _row(widths: list[int], cells: list, text: str) -> str:
    return "  ".join([*(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)), text])


def format_footer(count: int, noun: str, prompt_tokens: int, cached: int, seconds: float) -> str:
    """The line under a table: how many rows, the prompt tokens (and how many of them the KV
    cache held), the time taken."""
    return (
        f"{count} {noun}, {prompt_tokens} prompt tokens ({cached} cached), {seconds * 1e3:.1f} ms"
    )


def format_stats(stats: msgspec.Struct) -> str:
    """One `name: value` line per counter."""
    values = msgspec.structs.asdict(stats).items()
    return "\n".join(
        f"{k + ':':<21}{round(v, 3) if isinstance(v, float) else v}" for k, v in values
    )
