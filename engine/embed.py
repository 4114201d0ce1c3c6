"""An embed call's arguments: checked before anything is tokenised, and the name its errors give
the texts (`input`, as OpenAI's field)."""

from collections.abc import Sequence

from engine import truncation
from engine.errors import InvalidInput, Unsupported
from engine.pairs import PairOptions

INPUT = {"items": "input"}  # the embed call's name for the items of its request


def embed_request(
    task, texts, *, prompt_name, prompt, truncate: bool, side: str
) -> tuple[list[str], PairOptions]:
    """An embed call's texts, each after its prompt, and how they are encoded (`embed_options`,
    `with_prompt`); Unsupported when the `task` is no embedder."""
    refused = task.embeddings_refused()
    if refused:
        raise Unsupported(refused)
    texts, options = embed_options(texts, task.config.max_length, truncate, side)
    return with_prompt(texts, task, prompt_name, prompt), options


def embed_options(texts, limit: int, truncate: bool, side: str) -> tuple[list[str], PairOptions]:
    """The texts as a list, and how they are encoded: each alone, refused over `limit` tokens
    unless `truncate` (then cut at `side`); InvalidInput naming the field otherwise."""
    if isinstance(texts, str) or not isinstance(texts, Sequence) or not texts:
        raise InvalidInput("input", "must be a non-empty list of strings")
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise InvalidInput(f"input[{bad}]", "must be a string")
    if side not in truncation.SIDES:
        raise InvalidInput("truncation_side", f"must be one of {', '.join(truncation.SIDES)}")
    return list(texts), PairOptions(limit=limit, side=side, truncate=truncate, alone=True)


def with_prompt(texts: list[str], task, name: str | None, prompt: str | None) -> list[str]:
    """Each text after the prompt `prompt`, or else after the embedder `task`'s prompt `name`
    (None: its default); InvalidInput naming `prompt_name` for a prompt it does not have."""
    if prompt is None:
        prompt = task.prompt(name)
    return [prompt + t for t in texts] if prompt else texts
