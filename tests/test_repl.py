"""The REPL: its command parser and state, its loop over a fake engine, and the real program end
to end (piped stdin, and a pseudo-terminal) against the offline scorer."""

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import trio

from engine import templates
from engine.engine import EngineOverloaded, EngineStats, RerankHit, RerankResult, ScoreResult
from engine.messages import Timings
from engine.repl import (
    Quit,
    Rerank,
    Say,
    Score,
    Session,
    ShowStats,
    clip,
    format_probability,
    format_rerank,
    format_scores,
    history_path,
    make_session,
    serve,
)

ROOT = Path(__file__).resolve().parent.parent
VOCAB = {"yes": [5], " yes": [6], "no": [7], " no": [8], "maybe": [9, 10]}


def fake_encode(text: str) -> list[int]:
    return VOCAB.get(text, [ord(c) for c in text])


@pytest.fixture
def session() -> Session:
    return Session(fake_encode, vocab_size=100)


def ready(session: Session, *items: str) -> Session:
    """A session with a query, labels yes/no and `items` pending."""
    for line in ["? the query", ":labels yes no", *items]:
        session.handle(line)
    return session


# --- parser and state ---------------------------------------------------------------------


def test_query_is_set_by_question_mark_or_command(session):
    assert session.handle("? Is Paris in France?") == Say("query: 'Is Paris in France?'")
    assert session.query == "Is Paris in France?"
    session.handle("?no space")
    assert session.query == "no space"
    session.handle(":query  leading space kept")
    assert session.query == " leading space kept"
    with pytest.raises(ValueError, match="query: needs text"):
        session.handle(":query")
    assert session.query == " leading space kept"


def test_plain_lines_are_items_and_backslash_escapes(session):
    for line in [" yes it is", "\\:not a command", "\\?not a query", "\\\\two"]:
        assert session.handle(line) is None
    assert session.items == [" yes it is", ":not a command", "?not a query", "\\two"]
    assert session.prompt() == "score[4]> "


def test_empty_line_scores_pending_items_then_clears_them(session):
    assert ready(session).handle("") is None  # nothing pending: nothing to do
    ready(session, "a", "b")
    assert session.handle("") == Score(
        "the query", ["a", "b"], [5, 7], ["'yes'", "'no'"], False, False
    )
    assert session.items == []
    session.handle("c")
    assert session.handle(":score").items == ["c"]


def test_score_needs_query_items_and_labels(session):
    with pytest.raises(ValueError, match="no query: set one with `\\? text`"):
        session.handle(":score")
    session.handle("? q")
    with pytest.raises(ValueError, match="no items: type one per line"):
        session.handle(":score")
    session.handle("an item")
    with pytest.raises(ValueError, match="no labels: set them with `:labels"):
        session.handle("")
    assert session.items == ["an item"]  # kept: nothing was sent


def test_labels_by_text_quoted_text_and_id(session):
    assert session.handle(':labels yes " no" #42') == Say("labels: 'yes' (#5), ' no' (#8), #42")
    assert session.labels == [("'yes'", 5), ("' no'", 8), ("#42", 42)]
    assert session.handle(":labels") == Say("labels: 'yes' (#5), ' no' (#8), #42")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (":labels yes maybe", r"label 'maybe' is 2 tokens \[9, 10\]; each label must be one token"),
        (":labels #100", r"label #100: outside the vocabulary \[0, 100\)"),
        (":labels #-1", r"outside the vocabulary"),
        (":labels #x", "'#' must be followed by a token id"),
        (':labels "yes', "labels: No closing quotation"),
    ],
)
def test_bad_labels_are_errors_and_keep_the_old_ones(session, line, message):
    session.handle(":labels no")
    with pytest.raises(ValueError, match=message):
        session.handle(line)
    assert session.labels == [("'no'", 7)]


def test_toggles_flip_or_set_and_report_the_new_state(session):
    assert session.handle(":softmax") == Say("softmax: on")
    assert session.handle(":softmax") == Say("softmax: off")
    assert session.handle(":softmax ON") == Say("softmax: on")
    assert session.handle(":item_first") == Say("item_first: on")
    assert session.handle(":item_first off") == Say("item_first: off")
    with pytest.raises(ValueError, match="softmax: expected on or off, got 'maybe'"):
        session.handle(":softmax maybe")
    assert session.softmax
    action = ready(session, "x").handle(":score")
    assert (action.apply_softmax, action.item_first) == (True, False)


def test_rerank_mode_with_instruction_and_top(session):
    assert session.handle(":rerank") == Say("rerank: on")
    assert session.prompt() == "rerank> "
    assert session.handle(":instruction Find answers") == Say("instruction: 'Find answers'")
    assert session.handle(":top 2") == Say("top: 2")
    session.handle("? where")
    session.handle("doc a")
    session.handle("doc b")
    assert session.handle("") == Rerank("where", ["doc a", "doc b"], 2, "Find answers")
    assert session.handle(":top all") == Say("top: all")
    assert session.handle(":instruction") == Say("instruction: (default)")
    session.handle("doc c")
    assert session.handle("") == Rerank("where", ["doc c"], None, None)  # needs no labels
    for bad in [":top 0", ":top -1", ":top x"]:
        with pytest.raises(ValueError, match="top: expected a positive number or 'all'"):
            session.handle(bad)
    assert session.handle(":rerank off") == Say("rerank: off")


def test_clear_show_stats_help_quit(session):
    ready(session, "one", "two")
    assert session.handle(":clear") == Say("dropped 2 pending items")
    session.handle("three")
    shown = session.handle(":show").text
    for expected in ["mode:        score", "query:       'the query'", "labels:      'yes' (#5)"]:
        assert expected in shown
    assert "softmax:     off" in shown and "pending:     1 items" in shown
    assert shown.endswith("[0] 'three'")
    assert session.handle(":stats") == ShowStats()
    help_text = session.handle(":help").text
    for name in Session.COMMANDS:
        assert f":{name} " in help_text
    assert "? TEXT" in help_text and "empty line" in help_text
    assert session.handle(":quit") == session.handle(":exit") == session.handle(":q") == Quit()


def test_unique_prefixes_and_unknown_commands(session):
    assert session.handle(":lab yes") == Say("labels: 'yes' (#5)")
    assert session.handle(":so") == Say("softmax: on")
    with pytest.raises(ValueError, match=r":s is ambiguous \(:score, :softmax, :show, :stats\)"):
        session.handle(":s")
    with pytest.raises(ValueError, match=r"unknown command :frobnicate \(:help lists"):
        session.handle(":frobnicate")
    with pytest.raises(ValueError, match=r"unknown command : \(:help"):
        session.handle(":")


# --- formatting ---------------------------------------------------------------------------


def test_probabilities_keep_seven_significant_digits():
    assert format_probability(0.0123456789) == "0.012345679"
    assert format_probability(1.0) == "1.000000000"
    assert format_probability(0.000123456789) == "1.234568e-04"
    for p in [0.5, 0.00123, 0.000999, 1e-9]:
        assert float(format_probability(p)) == pytest.approx(p, rel=1e-6)


def test_clip_escapes_control_characters_and_truncates():
    assert clip("a\tb", 10) == "a\\tb"
    assert clip("x" * 30, 10) == "x" * 9 + "…"
    assert clip("short", 10) == "short"


def test_score_table_has_fixed_columns_and_one_row_per_item():
    action = Score(
        "q", ["first", "a much longer item " * 10], [5, 7], ["'yes'", "#7"], False, False
    )
    lines = format_scores(action, [[0.5, 0.25], [0.0001, 1.0]], columns=80).splitlines()
    assert lines == [
        "  #         'yes'            #7  item",
        "  0   0.500000000   0.250000000  first",
        "  1  1.000000e-04   1.000000000  " + ("a much longer item " * 3)[:45] + "…",
    ]
    assert all(len(line) <= 80 for line in lines)


def test_rerank_table_lists_hits_in_order():
    hits = [RerankHit(index=1, relevance_score=0.75), RerankHit(index=0, relevance_score=0.125)]
    assert format_rerank(["doc a", "doc b", "doc c"], hits, columns=80).splitlines() == [
        "rank  index     relevance  document",
        "   1      1   0.750000000  doc b",
        "   2      0   0.125000000  doc a",
    ]


# --- the loop, over a fake engine ---------------------------------------------------------


class FakeEngine:
    """Scores each item by its length; fails on an item "bad" and when asked to be overloaded."""

    def __init__(self):
        self.calls = []

    async def score(self, query, items, labels, *, apply_softmax, item_first):
        self.calls.append((query, items, labels, apply_softmax, item_first))
        if "bad" in items:
            raise ValueError("items[0]: too bad")
        if "busy" in items:
            raise EngineOverloaded("queue full")
        return ScoreResult(
            scores=[[len(it) / 100] * len(labels) for it in items],
            prompt_tokens=7,
            timings=Timings(total=0.002),
        )

    async def rerank(self, query, documents, *, top_n, instruction):
        hits = sorted(
            (RerankHit(index=i, relevance_score=len(d) / 100) for i, d in enumerate(documents)),
            key=lambda h: -h.relevance_score,
        )
        return RerankResult(results=hits[:top_n], prompt_tokens=9, timings=Timings())

    def stats(self):
        return EngineStats(**dict.fromkeys(EngineStats.__struct_fields__, 0))


def run_serve(lines: list[str]) -> tuple[FakeEngine, list[str], list[str], list[str]]:
    """Serve `lines` then end of input; the engine, the prompts, what was written, the errors."""
    engine, prompts, out, errors = FakeEngine(), [], [], []
    pending = iter(lines)

    def read_line(prompt):
        prompts.append(prompt)
        return next(pending, None)

    trio.run(serve, engine, ready(Session(fake_encode, 100)), read_line, out.append, errors.append)
    return engine, prompts, out, errors


def test_serve_prints_tables_and_keeps_going_after_errors():
    engine, prompts, out, errors = run_serve(
        [":bogus", "abc", "bad", "", "busy", "", "abcd", "", ":rerank", "xx", "xxxx", "", ":stats"]
    )
    assert errors == [
        "error: unknown command :bogus (:help lists the commands)",
        "error: items[0]: too bad",
        "error: queue full",
    ]
    table, footer = out[0].rsplit("\n", 1)
    assert table.splitlines()[1] == "  0   0.040000000   0.040000000  abcd"
    assert footer == "1 items, 7 prompt tokens, 2.0 ms"
    assert out[1] == "rerank: on"
    assert out[2].splitlines()[1:3] == [
        "   1      1   0.040000000  xxxx",
        "   2      0   0.020000000  xx",
    ]
    assert out[3].startswith("in_flight:")
    assert [c[1] for c in engine.calls] == [["abc", "bad"], ["busy"], ["abcd"]]
    assert prompts[:3] == ["score> ", "score> ", "score[1]> "]


def test_serve_scores_pending_items_at_end_of_input_and_stops_at_quit():
    engine, _, out, _ = run_serve(["tail item"])
    assert engine.calls == [("the query", ["tail item"], [5, 7], False, False)]
    assert "tail item" in out[0]
    engine, prompts, _, _ = run_serve([":quit", "never read", ""])
    assert engine.calls == [] and len(prompts) == 1


def test_default_labels_are_yes_and_no_where_those_are_single_tokens():
    def engine_with(vocab):
        encode = lambda text: SimpleNamespace(ids=vocab.get(text, [1, 2]))
        model = SimpleNamespace(
            tokenizer=SimpleNamespace(encode=lambda text, add_special_tokens: encode(text)),
            config=SimpleNamespace(vocab_size=100),
        )
        return SimpleNamespace(model=model)

    assert make_session(engine_with(VOCAB)).labels == [("' yes'", 6), ("' no'", 8)]
    assert make_session(engine_with({" yes": [6]})).labels == []


def test_history_path_is_none_without_a_usable_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert history_path() == tmp_path / ".llm_scoring_engine_history"
    monkeypatch.setenv("HOME", str(tmp_path / "missing"))
    assert history_path() is None


# --- end to end: the real program ---------------------------------------------------------

ANSI = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|[=>])")
QUERY = "Is the river near the house?"
ITEMS = [" the river is green", " quick paper", " stone house light"]


def repl_args(path: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "engine.repl",
        "--model",
        path,
        "--dtype",
        "float32",
        "--no-precompile",
    ]


def repl_env(home: Path) -> dict[str, str]:
    return {**os.environ, "JAX_PLATFORMS": "cpu", "HOME": str(home), "COLUMNS": "100"}


def tables(text: str) -> list[list[str]]:
    """The row lines of each table in `text` (a table: a header line, then numbered rows)."""
    found, rows = [], None
    for line in ANSI.sub("", text).replace("\r", "").splitlines():
        cells = line.split()
        if cells[:1] in (["#"], ["rank"]) and cells[-1] in ("item", "document"):
            rows = []
            found.append(rows)
        elif rows is not None and re.match(r"\s*\d+\s+\d", line):
            rows.append(line)
        else:
            rows = None
    return found


def score_rows(rows: list[str], labels: int) -> np.ndarray:
    """f64[items, labels] from score-table rows, checking the index column counts up."""
    assert [int(r.split()[0]) for r in rows] == list(range(len(rows)))
    return np.array([[float(x) for x in r.split()[1 : 1 + labels]] for r in rows])


def rerank_rows(rows: list[str]) -> list[tuple[int, float]]:
    """(index, relevance) per rerank-table row, best first."""
    assert [int(r.split()[0]) for r in rows] == list(range(1, len(rows) + 1))
    return [(int(r.split()[1]), float(r.split()[2])) for r in rows]


def one_token(tokenizer, text: str) -> int:
    (token,) = tokenizer.encode(text, add_special_tokens=False).ids
    return token


def test_piped_script(tiny_path, reference, tmp_path):
    the = one_token(reference.tokenizer, " the")
    docs = [d.strip() for d in ITEMS]
    script = [
        ':labels " the" #3 #4',
        f"? {QUERY}",
        *ITEMS,
        "",
        ":softmax",
        *ITEMS,
        ":score",
        ":softmax off",
        ":item_first",
        *ITEMS[:2],
        "",
        ":labels xyzzyq",
        ":bogus",
        ":score",
        ":rerank",
        "? where is the house?",
        *docs,
        ":top 2",
        "",
        ":stats",
        ":quit",
        "after quit",
    ]
    done = subprocess.run(
        repl_args(tiny_path),
        input="\n".join(script) + "\n",
        capture_output=True,
        text=True,
        env=repl_env(tmp_path),
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "score>" not in done.stdout  # no prompts on a pipe
    assert "ready:" in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 3, done.stderr
    assert errors[0].startswith("error: label 'xyzzyq' is ")
    assert errors[1:] == [
        "error: unknown command :bogus (:help lists the commands)",
        "error: no items: type one per line, then an empty line",
    ]
    found = tables(done.stdout)
    assert len(found) == 4, done.stdout
    labels = [the, 3, 4]
    plain, soft, first = (score_rows(t, 3) for t in found[:3])
    np.testing.assert_allclose(plain, reference.score(QUERY, ITEMS, labels), rtol=1e-5)
    np.testing.assert_allclose(
        soft, reference.score(QUERY, ITEMS, labels, apply_softmax=True), rtol=1e-5
    )
    np.testing.assert_allclose(soft.sum(axis=1), 1.0, atol=1e-8)
    np.testing.assert_allclose(soft, plain / plain.sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(
        first, reference.score(QUERY, ITEMS[:2], labels, item_first=True), rtol=1e-5
    )
    assert not np.allclose(first, plain[:2], rtol=1e-3)

    t = templates.template_for(reference.config.family, reference.tokenizer)
    want = reference.score(
        t.query_text("where is the house?", None),
        [t.document_text(d) for d in docs],
        list(templates.label_ids(t, reference.tokenizer)),
        apply_softmax=True,
    )
    order = sorted(range(3), key=lambda i: -want[i][0])[:2]
    got = rerank_rows(found[3])
    assert [i for i, _ in got] == order
    np.testing.assert_allclose([s for _, s in got], [want[i][0] for i in order], rtol=1e-5)
    assert "in_flight:" in done.stdout and "after quit" not in done.stdout


# Make the pty the controlling terminal (so Ctrl-C sends SIGINT), then become the program. Done
# in the child rather than with preexec_fn, which forks the multithreaded (JAX) test process.
ADOPT_TERMINAL = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


class Terminal:
    """A process on a pseudo-terminal: `expect` a pattern in its output, `send` it a line."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path):
        self.fd, child = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ADOPT_TERMINAL, *args],
            stdin=child,
            stdout=child,
            stderr=child,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        os.close(child)
        self.seen = ""  # output not yet consumed by `expect`

    def expect(self, pattern: str, timeout: float = 60) -> re.Match:
        """The first match of `pattern` in the output not yet consumed; consumes up to its end."""
        deadline = time.monotonic() + timeout
        while not (match := re.search(pattern, self.seen)):
            if not self._read(deadline - time.monotonic()):
                raise AssertionError(f"no {pattern!r} in output:\n{self.seen}")
        self.seen = self.seen[match.end() :]
        return match

    def rest(self) -> str:
        """Everything not yet consumed, up to the process closing the terminal."""
        while self._read(30):
            pass
        return self.seen

    def _read(self, timeout: float) -> bool:
        """Read what arrives within `timeout`; False at timeout or end of output."""
        if timeout <= 0 or not select.select([self.fd], [], [], timeout)[0]:
            return False
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # Linux: EIO once the child has closed the terminal
            return False
        self.seen += ANSI.sub("", chunk.decode(errors="replace")).replace("\r", "")
        return bool(chunk)

    def send(self, line: str) -> None:
        os.write(self.fd, line.encode() + b"\r")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.fd)


def test_terminal_session(tiny_path, reference, tmp_path):
    term = Terminal(repl_args(tiny_path), {**repl_env(tmp_path), "TERM": "dumb"}, ROOT)
    try:
        term.expect(r"ready:.*\n", timeout=240)
        term.expect(r"score> ")
        term.send(":labels #3 #4")
        term.expect(r"labels: #3, #4\n")
        term.expect(r"score> ")
        term.send(f"? {QUERY}")
        term.expect(r"score> ")
        for i, item in enumerate(ITEMS[:2]):
            term.send(item)
            term.expect(rf"score\[{i + 1}\]> ")
        term.send("")
        plain = term.expect(r"(?s)\n(  # .*?)\n2 items, \d+ prompt tokens").group(1)
        term.expect(r"score> ")
        term.send(":nope")
        term.expect(r"error: unknown command :nope \(:help lists the commands\)\n")
        term.expect(r"score> ")
        term.send(":softmax")
        term.expect(r"softmax: on\n")
        term.expect(r"score> ")
        term.send(ITEMS[0])
        term.expect(r"score\[1\]> ")
        term.send(ITEMS[1])
        term.expect(r"score\[2\]> ")
        term.send(":score")
        soft = term.expect(r"(?s)\n(  # .*?)\n2 items, \d+ prompt tokens").group(1)
        term.expect(r"score> ")
        os.write(term.fd, b"\x03")  # Ctrl-C: a clean exit, history saved, no traceback
        assert term.proc.wait(timeout=30) == 130
        assert "Traceback" not in term.rest()
    finally:
        term.close()
    (plain_rows,), (soft_rows,) = tables(plain), tables(soft)
    plain, soft = score_rows(plain_rows, 2), score_rows(soft_rows, 2)
    np.testing.assert_allclose(plain, reference.score(QUERY, ITEMS[:2], [3, 4]), rtol=1e-5)
    np.testing.assert_allclose(
        soft, reference.score(QUERY, ITEMS[:2], [3, 4], apply_softmax=True), rtol=1e-5
    )
    np.testing.assert_allclose(soft.sum(axis=1), 1.0, atol=1e-8)
    history = (tmp_path / ".llm_scoring_engine_history").read_text()
    assert ":labels #3 #4" in history and ":softmax" in history


def test_a_missing_model_is_an_error_not_a_traceback(tmp_path):
    done = subprocess.run(
        repl_args(str(tmp_path / "no-such-model")),
        input="",
        capture_output=True,
        text=True,
        env=repl_env(tmp_path),
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("error: ")
    assert "Traceback" not in done.stderr
