"""An interactive scorer over the embeddable engine.

    python -m engine.repl [--model PATH] [--dtype bfloat16|float32] [--token-budget N]
                          [--no-precompile]

Set a query with `? text`, type one item per line, and an empty line scores them: a table of each
item's label probabilities (or, with `:rerank`, the documents in relevance order). `:help` lists
the commands. Piped input works for scripts: no prompts, results on stdout, errors on stderr as
`error: <message>`; whatever items are pending at end of input are scored.
"""

import argparse
import contextlib
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import msgspec
import trio

from engine.engine import Engine, EngineConfig, EngineError, RerankHit, open_engine
from engine.scoring import DTYPES

DEFAULT_LABELS = (" yes", " no")
HISTORY_FILE = ".llm_scoring_engine_history"
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
class ShowStats:
    """Print the engine's counters."""


@dataclass(frozen=True)
class Quit:
    """End the session."""


Action = Say | Score | Rerank | ShowStats | Quit


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
        self.instruction: str | None = None
        self.top_n: int | None = None

    def prompt(self) -> str:
        pending = f"[{len(self.items)}]" if self.items else ""
        return f"{'rerank' if self.rerank else 'score'}{pending}> "

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

    def _score(self, arg: str) -> Score | Rerank:
        if self.query is None:
            raise ValueError("no query: set one with `? text`")
        if not self.items:
            raise ValueError("no items: type one per line, then an empty line")
        if self.rerank:
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
            ("mode", "rerank" if self.rerank else "score"),
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
        "top": (_top, "[N|all]", "rerank: show only the best N documents"),
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


def format_probability(p: float) -> str:
    """Nine decimals, or scientific notation below 1e-3, so small values keep 7 digits."""
    return f"{p:.9f}" if p >= 1e-3 else f"{p:.6e}"


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


def format_rerank(documents: list[str], hits: list[RerankHit], columns: int) -> str:
    """One row per returned document, best first: rank, index, relevance score, document text."""
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
    return "\n".join([_row(widths, ["rank", "index", "relevance"], "document"), *rows])


def _row(widths: list[int], cells: list, text: str) -> str:
    return "  ".join([*(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)), text])


def format_footer(count: int, noun: str, prompt_tokens: int, seconds: float) -> str:
    return f"{count} {noun}, {prompt_tokens} prompt tokens, {seconds * 1e3:.1f} ms"


def format_stats(stats: msgspec.Struct) -> str:
    """One `name: value` line per counter."""
    values = msgspec.structs.asdict(stats).items()
    return "\n".join(
        f"{k + ':':<21}{round(v, 3) if isinstance(v, float) else v}" for k, v in values
    )


async def perform(engine: Engine, action: Action, columns: int) -> str:
    """Run one action against the engine; the text to print."""
    match action:
        case Say(text):
            return text
        case ShowStats():
            return format_stats(engine.stats())
        case Score():
            r = await engine.score(
                action.query,
                action.items,
                action.label_ids,
                apply_softmax=action.apply_softmax,
                item_first=action.item_first,
            )
            foot = format_footer(len(r.scores), "items", r.prompt_tokens, r.timings.total)
            return f"{format_scores(action, r.scores, columns)}\n{foot}"
        case Rerank():
            r = await engine.rerank(
                action.query,
                action.documents,
                top_n=action.top_n,
                instruction=action.instruction,
            )
            foot = format_footer(
                len(action.documents), "documents", r.prompt_tokens, r.timings.total
            )
            return f"{format_rerank(action.documents, r.results, columns)}\n{foot}"
    raise TypeError(f"not an action: {action!r}")


async def serve(
    engine: Engine,
    session: Session,
    read_line: Callable[[str], str | None],
    write: Callable[[str], None],
    error: Callable[[str], None],
) -> None:
    """Read lines until `:quit` or end of input (None), printing each result or `error: ...`.

    `read_line(prompt)` blocks, so it runs in a worker thread; end of input first scores
    whatever items are still pending.
    """
    while True:
        line = await trio.to_thread.run_sync(read_line, session.prompt(), abandon_on_cancel=True)
        try:
            action = session.handle("" if line is None else line)
            if isinstance(action, Quit):
                return
            if action is not None:
                write(await perform(engine, action, shutil.get_terminal_size((100, 24)).columns))
        except (ValueError, EngineError) as e:
            error(f"error: {e}")
        if line is None:
            return


def make_session(engine: Engine) -> Session:
    """A session for this engine's tokenizer, labelled " yes" / " no" where those are tokens."""
    tokenizer = engine.model.tokenizer
    session = Session(
        lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
        engine.model.config.vocab_size,
    )
    with contextlib.suppress(ValueError):  # not single tokens here: the user picks labels
        session.set_labels(DEFAULT_LABELS)
    return session


def read_tty(prompt: str) -> str | None:
    """One line typed at the terminal (with line editing), or None at end of input."""
    try:
        return input(prompt)
    except EOFError:
        print(flush=True)  # end the prompt line
        return None


def read_pipe(prompt: str) -> str | None:
    """One line of piped input, without a prompt, or None at end of input."""
    line = sys.stdin.readline()
    return line.removesuffix("\n").removesuffix("\r") if line else None


def history_path() -> Path | None:
    """The history file under the user's home, or None where home is unknown or read-only."""
    try:
        home = Path.home()
    except (RuntimeError, KeyError):
        return None
    return home / HISTORY_FILE if os.access(home, os.W_OK) else None


def enable_history() -> Callable[[], None]:
    """Line editing and history (when `readline` exists); returns the function that saves it."""
    try:
        import readline
    except ImportError:
        return lambda: None
    path = history_path()
    if path is None:
        return lambda: None
    readline.set_history_length(1000)
    with contextlib.suppress(OSError):  # no history yet, or unreadable: start empty
        readline.read_history_file(path)

    def save() -> None:
        with contextlib.suppress(OSError):  # losing history must not fail the exit
            readline.write_history_file(path)

    return save


def _print(text: str, file=None) -> None:
    print(text, file=file or sys.stdout, flush=True)


def _describe(engine: Engine, started: float) -> str:
    cfg = engine.config
    s = engine.stats()
    compiled = f"{s.compiles} programs compiled" if cfg.precompile else "compiling on demand"
    family = engine.model.config.family
    return (
        f"ready: {cfg.model or 'default model'} ({family}, {cfg.dtype}, {compiled}, "
        f"{time.perf_counter() - started:.1f}s); :help lists the commands"
    )


async def run(config: EngineConfig) -> None:
    """Open the engine, then serve lines from stdin until the user quits."""
    started = time.perf_counter()
    _print(f"loading {config.model or 'the default model'} ...", sys.stderr)
    async with open_engine(config) as engine:
        _print(_describe(engine, started), sys.stderr)
        tty = sys.stdin.isatty() and sys.stdout.isatty()  # else prompts would land in the output
        save_history = enable_history() if tty else lambda: None
        try:
            await serve(
                engine,
                make_session(engine),
                read_tty if tty else read_pipe,
                _print,
                lambda text: _print(text, sys.stderr),
            )
        finally:
            save_history()


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.repl", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model", metavar="PATH", help="a .gguf file or HF directory (default: SmolLM2)"
    )
    p.add_argument(
        "--dtype", default="bfloat16", choices=sorted(DTYPES), help="weight dtype (%(default)s)"
    )
    p.add_argument(
        "--token-budget",
        metavar="N",
        type=_positive,
        default=EngineConfig().token_budget,
        help="most tokens in one packed batch (%(default)s)",
    )
    p.add_argument(
        "--no-precompile", action="store_true", help="compile each shape on first use instead"
    )
    return p


def _interrupted(e: BaseException) -> bool:
    if isinstance(e, BaseExceptionGroup):
        return e.split(KeyboardInterrupt)[1] is None
    return isinstance(e, KeyboardInterrupt)


def main(argv: list[str] | None = None) -> int:
    """Run the REPL; the process exit status."""
    args = parser().parse_args(argv)
    config = EngineConfig(
        model=args.model,
        dtype=args.dtype,
        token_budget=args.token_budget,
        precompile=not args.no_precompile,
    )
    for stream in (sys.stdin, sys.stdout):  # a stray non-UTF-8 byte must not end the session
        stream.reconfigure(errors="replace")
    try:
        trio.run(run, config)
    except (ValueError, OSError) as e:  # the model could not be loaded
        _print(f"error: {e}", sys.stderr)
        return 1
    except BaseException as e:
        if _interrupted(e):
            _print("", sys.stderr)  # the shell's prompt starts on a fresh line
            return 130
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
