"""The REPL's state and command language: one input line in, one action out.

`Session.handle` parses a line against the current settings and returns what to do (an
`Action`); running that action against an engine and printing the result is `engine.repl.loop`'s
job, so everything here is pure and testable without a model.
"""

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

ALIASES = {"q": "quit", "exit": "quit", "h": "help", "?": "help"}


@dataclass(frozen=True)
class Say:
    """Print this text."""

    text: str


@dataclass(frozen=True)
class Score:
    """Score `items` against `query` by the label ids; `label_names` head the table columns."""

    query: str
    items: list[str]
    label_ids: list[int]
    label_names: list[str]
    apply_softmax: bool
    item_first: bool


@dataclass(frozen=True)
class Rerank:
    """Rerank `documents` by relevance to `query`."""

    query: str
    documents: list[str]
    top_n: int | None
    instruction: str | None


@dataclass(frozen=True)
class Embed:
    """Rank `documents` by the cosine similarity of their embeddings to `query`'s."""

    query: str
    documents: list[str]
    top_n: int | None


@dataclass(frozen=True)
class ShowStats:
    """Print the engine's counters."""


@dataclass(frozen=True)
class Quit:
    """End the session."""


Action = Say | Score | Rerank | Embed | ShowStats | Quit


class Session:
    """The REPL's settings and pending items; `handle(line)` turns one input line into an action.

    Pure apart from `encode` (label text -> token ids). User mistakes raise ValueError with a
    message meant to be shown as is; state is unchanged when they do.
    """

    def __init__(self, encode: Callable[[str], list[int]], vocab_size: int):
        self.encode = encode
        self.vocab_size = vocab_size
        self.query: str | None = None
        self.items: list[str] = []
        self.labels: list[tuple[str, int]] = []  # (column name, token id)
        self.softmax = False
        self.item_first = False
        self.rerank = False
        self.embed = False  # an embedder's session: items ranked by similarity to the query
        self.instruction: str | None = None
        self.top_n: int | None = None

    def prompt(self) -> str:
        """The input prompt: the mode, and how many items are pending."""
        pending = f"[{len(self.items)}]" if self.items else ""
        return f"{self._mode()}{pending}> "

    def _mode(self) -> str:
        return "embed" if self.embed else "rerank" if self.rerank else "score"

    def handle(self, line: str) -> Action | None:
        """The action for one input line (None: nothing to do)."""
        if line.startswith(":"):
            name, _, arg = line[1:].partition(" ")
            return self.COMMANDS[self._command(name)][0](self, arg)
        if line.startswith("?"):
            return self._query(line[1:].removeprefix(" "))
        if not line:
            return self._score("") if self.items else None
        self.items.append(line.removeprefix("\\"))  # a leading \ escapes ':' and '?'
        return None

    def _command(self, name: str) -> str:
        name = ALIASES.get(name, name)
        if name in self.COMMANDS:
            return name
        matches = [c for c in self.COMMANDS if name and c.startswith(name)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise ValueError(f":{name} is ambiguous ({', '.join(':' + m for m in matches)})")
        raise ValueError(f"unknown command :{name} (:help lists the commands)")

    def _query(self, arg: str) -> Say:
        if not arg:
            raise ValueError("query: needs text, e.g. `? Is Paris in France?`")
        self.query = arg
        return Say(f"query: {arg!r}")

    def _labels(self, arg: str) -> Say:
        if arg.strip():
            try:
                words = shlex.split(arg)
            except ValueError as e:
                raise ValueError(f"labels: {e}") from None
            self.labels = [self._label(w) for w in words]
        return Say(f"labels: {self._label_list()}")

    def set_labels(self, texts: Sequence[str]) -> None:
        """Label tokens by text (each one token); ValueError otherwise."""
        self.labels = [self._label(t) for t in texts]

    def _label(self, word: str) -> tuple[str, int]:
        if word.startswith("#") and len(word) > 1:
            try:
                token = int(word[1:])
            except ValueError:
                raise ValueError(f"label {word}: '#' must be followed by a token id") from None
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"label {word}: outside the vocabulary [0, {self.vocab_size})")
            return word, token
        ids = self.encode(word)
        if len(ids) != 1:
            raise ValueError(
                f"label {word!r} is {len(ids)} tokens {ids}; each label must be one token "
                '(quote to keep spaces, e.g. " yes", or give an id as #123)'
            )
        return repr(word), ids[0]

    def _label_list(self) -> str:
        return ", ".join(f"{n} (#{t})" if n[0] != "#" else n for n, t in self.labels) or "(none)"

    def _score(self, arg: str) -> Score | Rerank | Embed:
        if self.query is None:
            raise ValueError("no query: set one with `? text`")
        if not self.items:
            raise ValueError("no items: type one per line, then an empty line")
        if self.embed:
            action = Embed(self.query, self.items, self.top_n)
        elif self.rerank:
            action = Rerank(self.query, self.items, self.top_n, self.instruction)
        elif not self.labels:
            raise ValueError("no labels: set them with `:labels yes no` or `:labels #id ...`")
        else:
            names, ids = (list(x) for x in zip(*self.labels, strict=True))
            action = Score(self.query, self.items, ids, names, self.softmax, self.item_first)
        self.items = []
        return action

    def _clear(self, arg: str) -> Say:
        dropped, self.items = len(self.items), []
        return Say(f"dropped {dropped} pending items")

    def _softmax(self, arg: str) -> Say:
        self.softmax = _switch("softmax", self.softmax, arg)
        return Say(f"softmax: {_on(self.softmax)}")

    def _item_first(self, arg: str) -> Say:
        self.item_first = _switch("item_first", self.item_first, arg)
        return Say(f"item_first: {_on(self.item_first)}")

    def _rerank(self, arg: str) -> Say:
        if self.embed:
            raise ValueError("rerank: this model embeds; items are ranked by similarity")
        self.rerank = _switch("rerank", self.rerank, arg)
        return Say(f"rerank: {_on(self.rerank)}")

    def _instruction(self, arg: str) -> Say:
        self.instruction = arg or None
        return Say(f"instruction: {self._instruction_text()}")

    def _instruction_text(self) -> str:
        return "(default)" if self.instruction is None else repr(self.instruction)

    def _top(self, arg: str) -> Say:
        arg = arg.strip().lower()
        if arg in ("", "all"):
            self.top_n = None
        elif arg.isdigit() and int(arg) > 0:
            self.top_n = int(arg)
        else:
            raise ValueError(f"top: expected a positive number or 'all', got {arg!r}")
        return Say(f"top: {self.top_n or 'all'}")

    def _show(self, arg: str) -> Say:
        rows = [
            ("mode", self._mode()),
            ("query", "(none)" if self.query is None else repr(self.query)),
            ("labels", self._label_list()),
            ("softmax", _on(self.softmax)),
            ("item_first", _on(self.item_first)),
            ("instruction", self._instruction_text()),
            ("top", str(self.top_n or "all")),
            ("pending", f"{len(self.items)} items"),
        ]
        lines = [f"{k + ':':<13}{v}" for k, v in rows]
        return Say("\n".join(lines + [f"  [{i}] {it!r}" for i, it in enumerate(self.items)]))

    def _help(self, arg: str) -> Say:
        rows = [
            ("? TEXT", "set the query (same as :query TEXT)"),
            ("any other line", "add an item (start it with \\ to add one that begins : or ?)"),
            ("empty line", "score the pending items (same as :score)"),
            *((f":{name} {usage}", text) for name, (_, usage, text) in self.COMMANDS.items()),
        ]
        lines = [f"  {command:<22}{text}" for command, text in rows]
        tail = "Commands may be shortened to any unique prefix (:lab, :so)."
        return Say("\n".join([*lines, tail]))

    COMMANDS: ClassVar[dict] = {  # name -> (handler, usage, help); the order is the :help order
        "query": (_query, "TEXT", "set the query"),
        "labels": (_labels, "L1 L2 ..", 'label tokens: texts (quote spaces: " yes") or #ids'),
        "score": (_score, "", "score the pending items, then clear them"),
        "clear": (_clear, "", "drop the pending items"),
        "softmax": (_softmax, "[on|off]", "normalise the probabilities over the labels"),
        "item_first": (_item_first, "[on|off]", "score item + query instead of query + item"),
        "rerank": (_rerank, "[on|off]", "rerank mode: items are documents, best first"),
        "instruction": (_instruction, "[TEXT]", "rerank instruction (none: the default)"),
        "top": (_top, "[N|all]", "rerank, embed: show only the best N documents"),
        "show": (_show, "", "current settings and pending items"),
        "stats": (lambda s, a: ShowStats(), "", "engine counters"),
        "help": (_help, "", "this list"),
        "quit": (lambda s, a: Quit(), "", "exit (also :exit, :q, Ctrl-D; Ctrl-C interrupts)"),
    }


def _switch(name: str, current: bool, arg: str) -> bool:
    """The new value of an on/off setting: `arg` "on" or "off", or empty to flip it."""
    value = {"": not current, "on": True, "off": False}.get(arg.strip().lower())
    if value is None:
        raise ValueError(f"{name}: expected on or off, got {arg.strip()!r}")
    return value


def _on(flag: bool) -> str:
    return "on" if flag else "off"
