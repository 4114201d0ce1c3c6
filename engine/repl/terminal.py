"""The REPL's terminal I/O: reading lines from a tty (with line editing and history) or a pipe,
and printing results and errors."""

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

HISTORY_FILE = ".llm_scoring_engine_history"


def interactive() -> bool:
    """Whether a person is typing: prompts and line editing only then, else prompts would land
    in the output."""
    return sys.stdin.isatty() and sys.stdout.isatty()


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


def say(text: str) -> None:
    """Print a result on stdout, at once."""
    print(text, flush=True)


def warn(text: str) -> None:
    """Print a message (progress, an error) on stderr, at once."""
    print(text, file=sys.stderr, flush=True)
