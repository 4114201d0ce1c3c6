"""An embed call's arguments: checked before anything is tokenised, the name its errors give
the texts (`input`, as OpenAI's field), and how its pooled outputs become its vectors."""

from collections.abc import Sequence

import msgspec
import numpy as np

from engine.errors import InvalidInput
from engine.host import truncation
from engine.host.pairs import PairOptions
from engine.kinds import Output
from engine.messages import ScoreRequest

# the embed call's names for the fields of the score request it makes
INPUT = {"items": "input", "max_prompt_tokens": "max_tokens"}


class EmbedCall(msgspec.Struct, frozen=True, kw_only=True):
    """One embed call, checked: its inputs (texts after their prompt, or token-id sequences as
    given), how they are encoded, and the vectors' width and normalisation."""

    inputs: list  # str texts, or list[int] token-id sequences
    pairs: PairOptions
    dimensions: int | None = None  # the vectors' first components kept (None: all)
    normalize: bool | None = None  # None: as the model's directory says

    def request(self, output: Output) -> ScoreRequest:
        """The request embedding the call's inputs for `output`."""
        return ScoreRequest(
            query="", items=self.inputs, label_token_ids=[], output=output, pairs=self.pairs
        )

    def vectors(self, task, outputs: np.ndarray) -> np.ndarray:
        """The call's vectors f32[N, D] from the pooled outputs f32[N, E] of `task`."""
        return task.head.embeddings(outputs, dimensions=self.dimensions, normalize=self.normalize)


def embed_request(
    task,
    inputs,
    *,
    prompt_name: str | None = None,
    prompt: str | None = None,
    truncate: bool = False,
    side: str = "right",
    dimensions: int | None = None,
    normalize: bool | None = None,
    max_tokens: int | None = None,
    role: str | None = None,
) -> EmbedCall:
    """An embed call of `inputs` (texts, or token-id sequences) to the embedder `task`, each
    text after its prompt, encoded as a text of `role` ("query", "document"; None: the
    model's one way, `Head.text_encoding`) and held to `max_tokens` tokens (None: the model's
    limit); InvalidInput naming the field."""
    limit, framing = task.head.text_encoding(role)
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidInput("max_tokens", "must be a positive integer")
        limit = min(limit, max_tokens)
    inputs, pairs = embed_options(inputs, limit, truncate, side)
    pairs = msgspec.structs.replace(pairs, framing=framing)
    if dimensions is not None:
        task.head.check_dimensions(dimensions)
    if normalize is not None and not isinstance(normalize, bool):
        raise InvalidInput("normalize", "must be true or false")
    return EmbedCall(
        inputs=with_prompt(inputs, task, prompt_name, prompt),
        pairs=pairs,
        dimensions=dimensions,
        normalize=normalize,
    )


def check_active_dims(keep: int | None) -> int | None:
    """A sparse vector's entries kept (`max_active_dims`), checked: None (all), or a positive
    integer; InvalidInput naming `max_active_dims` otherwise."""
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise InvalidInput("max_active_dims", "must be a positive integer")
    return keep


def embed_options(inputs, limit: int, truncate: bool, side: str) -> tuple[list, PairOptions]:
    """The inputs as a list (texts, token-id sequences, or both), and how they are encoded:
    each alone, refused over `limit` tokens unless `truncate` (then cut at `side`);
    InvalidInput naming the field otherwise."""
    if isinstance(inputs, str) or not isinstance(inputs, Sequence) or not inputs:
        raise InvalidInput("input", "must be a non-empty list of strings or of token-id lists")
    bad = next((i for i, x in enumerate(inputs) if not (isinstance(x, str) or _ids(x))), None)
    if bad is not None:
        raise InvalidInput(f"input[{bad}]", "must be a string or a non-empty list of token ids")
    if side not in truncation.SIDES:
        raise InvalidInput("truncation_side", f"must be one of {', '.join(truncation.SIDES)}")
    inputs = [x if isinstance(x, str) else list(x) for x in inputs]
    return inputs, PairOptions(limit=limit, side=side, truncate=truncate)


def _ids(x) -> bool:
    """Whether `x` is a non-empty sequence of token ids."""
    return (
        isinstance(x, Sequence)
        and not isinstance(x, str)
        and len(x) > 0
        and all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in x)
    )


def prompt_named(task, kind: str | None) -> str | None:
    """`kind` ("query", "document", ...) where the embedder `task` has a prompt of that name,
    else None: what a peer's `input_type` picks."""
    return kind if kind in task.head.prompts else None


def with_prompt(inputs: list, task, name: str | None, prompt: str | None) -> list:
    """Each text after the prompt `prompt`, or else after the embedder `task`'s prompt `name`
    (None: its default); token-id inputs as given. InvalidInput naming `prompt_name` for a
    prompt it does not have, or the field given where there are token ids (which take none)."""
    if not all(isinstance(x, str) for x in inputs):
        given = "prompt" if prompt is not None else "prompt_name" if name is not None else None
        if given:
            raise InvalidInput(given, "applies to texts; token ids are embedded as given")
    if prompt is None:
        prompt = task.head.prompt(name)
    if not prompt:
        return inputs
    return [prompt + x if isinstance(x, str) else x for x in inputs]
