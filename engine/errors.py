"""What can go wrong with a request, typed: the exceptions callers see and the kinds that carry
them across the actors' channels.

A bad input names its field where it is found (`InvalidInput.field`, e.g. "items[3]"); the
HTTP layer reports that field as is, without reading it back out of the message.
"""

import enum
from collections.abc import Sequence


class RejectKind(enum.Enum):
    """Why a request ended without scores; each kind is raised as its exception below."""

    INVALID = "invalid"  # the input is wrong: InvalidInput
    TOO_LARGE = "too_large"  # valid, over a size limit: InputTooLarge
    OVERLOADED = "overloaded"  # too much queued work: EngineOverloaded
    FAILED = "failed"  # a device step failed: EngineError
    CLOSED = "closed"  # the engine shut down: EngineClosed


class InvalidInput(ValueError):
    """A request the engine cannot score as given; `field` is the offending field's path."""

    def __init__(self, field: str | None, detail: str):
        super().__init__(f"{field}: {detail}" if field else detail)
        self.field = field
        self.detail = detail

    def renamed(self, names: dict[str, str]) -> "InvalidInput":
        """The same error reported against the caller's name for the field (`items` of a
        rerank are its `documents`): the head of the path is looked up in `names`."""
        if self.field is None:
            return self
        head, sep, rest = self.field.partition("[")
        field = names.get(head, head) + sep + rest
        return type(self)(field, self.detail)

    def reindexed(self, index: Sequence[int]) -> "InvalidInput":
        """The same error with the list index of its field (`documents[j]`) mapped through
        `index` (to `documents[index[j]]`): for an error found in a subset of a list."""
        head, sep, rest = (self.field or "").partition("[")
        position, _, tail = rest.partition("]")
        if not sep or not position.isdigit():
            return self
        return type(self)(f"{head}[{index[int(position)]}]{tail}", self.detail)


class InputTooLarge(InvalidInput):
    """Valid input over a size limit: too many items, or a sequence longer than the context."""


class EngineError(RuntimeError):
    """The engine could not score a valid request (a device step failed)."""


class EngineOverloaded(EngineError):
    """Too much queued work: retry later."""


class EngineClosed(EngineError):
    """The engine shut down before the request finished."""


class Unsupported(EngineError):
    """The loaded model cannot do what was asked (rerank without single-token labels)."""


def rejection_error(kind: RejectKind, message: str, field: str | None) -> Exception:
    """The exception a caller sees for a request rejected with `kind`."""
    if kind is RejectKind.INVALID:
        return InvalidInput(field, message)
    if kind is RejectKind.TOO_LARGE:
        return InputTooLarge(field, message)
    return {
        RejectKind.OVERLOADED: EngineOverloaded,
        RejectKind.FAILED: EngineError,
        RejectKind.CLOSED: EngineClosed,
    }[kind](message)


def rejection_kind(error: InvalidInput) -> RejectKind:
    return RejectKind.TOO_LARGE if isinstance(error, InputTooLarge) else RejectKind.INVALID
