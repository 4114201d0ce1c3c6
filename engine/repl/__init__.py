"""An interactive scorer over the embeddable engine: `python -m engine.repl` (usage in `cli`).

- `session`: the settings, the pending items and the command language (line -> action); pure
- `format`: result tables, footers and counters as text
- `terminal`: lines from a tty (line editing, history) or a pipe; printing
- `loop`: the trio loop that runs each action against the engine
- `cli`: the program: arguments, the engine, the terminal, the exit status
"""

from engine.repl.cli import DEFAULT_LABELS, main, make_session, parser, run
from engine.repl.format import (
    clip,
    format_footer,
    format_probability,
    format_rerank,
    format_scores,
    format_stats,
)
from engine.repl.loop import perform, serve
from engine.repl.session import Action, Embed, Quit, Rerank, Say, Score, Session, ShowStats
from engine.repl.terminal import HISTORY_FILE, enable_history, history_path, read_pipe, read_tty

__all__ = [
    "DEFAULT_LABELS",
    "HISTORY_FILE",
    "Action",
    "Embed",
    "Quit",
    "Rerank",
    "Say",
    "Score",
    "Session",
    "ShowStats",
    "clip",
    "enable_history",
    "format_footer",
    "format_probability",
    "format_rerank",
    "format_scores",
    "format_stats",
    "history_path",
    "main",
    "make_session",
    "parser",
    "perform",
    "read_pipe",
    "read_tty",
    "run",
    "serve",
]
