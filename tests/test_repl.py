"""The REPL program (`engine.repl.cli`, `python -m engine.repl`): the session it makes for an
engine, and the real program end to end (piped stdin, and a pseudo-terminal) against the offline
scorer."""

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

from engine import templates
from engine.capabilities import Ability, capabilities_of
from engine.models.config import Pooling
from engine.repl.cli import make_session
from engine.tasks import task_for
from tests.test_repl_support import VOCAB

ROOT = Path(__file__).resolve().parent.parent


def test_default_labels_are_yes_and_no_where_those_are_single_tokens():
    def engine_with(vocab, num_labels=0, embedding=None):
        encode = lambda text: SimpleNamespace(ids=vocab.get(text, [1, 2]))
        config = SimpleNamespace(
            vocab_size=100,
            num_labels=num_labels,
            encoder=False,
            embedding=embedding,
            splade=None,
            m3=None,
            colbert=None,
            family="llama",
        )
        task = task_for(config)
        return SimpleNamespace(
            tokenizer=SimpleNamespace(encode=lambda text, add_special_tokens: encode(text)),
            model_config=config,
            task=task,
            capabilities=capabilities_of(task, task.refusal(Ability.RERANK) or []),
        )

    assert make_session(engine_with(VOCAB)).labels == [("' yes'", 6), ("' no'", 8)]
    assert make_session(engine_with({" yes": [6]})).labels == []
    assert not make_session(engine_with(VOCAB)).rerank
    # a classification head (a cross-encoder) has no label scores: the session reranks
    assert make_session(engine_with(VOCAB, num_labels=1)).rerank
    # an embedder ranks by similarity
    assert not make_session(engine_with(VOCAB)).embed
    assert make_session(engine_with(VOCAB, embedding=Pooling(mode="last"))).embed


# --- end to end: the real program ---------------------------------------------------------

ANSI = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|[=>])")
QUERY = "Is the river near the house?"
ITEMS = [" the river is green", " quick paper", " stone house light"]


def repl_args(path: str, *flags: str) -> list[str]:
    """The command line of the REPL on `path` in f32 with `flags` (by default `--no-precompile`)."""
    flags = flags or ("--no-precompile",)
    return [sys.executable, "-m", "engine.repl", "--model", path, "--dtype", "float32", *flags]


def repl_env(home: Path) -> dict[str, str]:
    return {**os.environ, "JAX_PLATFORMS": "cpu", "HOME": str(home), "COLUMNS": "100"}


def run_script(
    path: str, script: list[str], home: Path, *flags: str
) -> subprocess.CompletedProcess:
    """The REPL on `path` (with `flags`, `repl_args`) fed `script` through a pipe, one line
    each."""
    return subprocess.run(
        repl_args(path, *flags),
        input="\n".join(script) + "\n",
        capture_output=True,
        text=True,
        env=repl_env(home),
        cwd=ROOT,
        timeout=300,
    )


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
    done = run_script(tiny_path, script, tmp_path)
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

    t = templates.template_for(reference.model_config.family, reference.tokenizer)
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


def test_a_grid_compiling_in_the_background(tiny_path, reference, tmp_path):
    flags = ("--precompile-in-background", "--token-budget", "256")
    script = [":labels #3 #4", f"? {QUERY}", *ITEMS, "", ":quit"]
    done = run_script(tiny_path, script, tmp_path, *flags)
    assert done.returncode == 0, done.stderr
    assert "compiling the bucket grid in the background" in done.stderr
    (found,) = tables(done.stdout)
    np.testing.assert_allclose(
        score_rows(found, 2), reference.score(QUERY, ITEMS, [3, 4]), rtol=1e-5
    )
    both = run_script(
        tiny_path, [":quit"], tmp_path, "--precompile-in-background", "--no-precompile"
    )
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_a_cross_encoder_reranks_from_the_start(tmp_path):
    from bench.encoders import write_encoder
    from engine import load_model
    from tests.conftest import CORPUS, TINY_ENCODER

    path = tmp_path / "bert"
    fields = dict(TINY_ENCODER, type_vocab_size=2)
    write_encoder(path, "BertConfig", fields, "bert", seed=3, corpus=CORPUS, model_max_length=64)
    docs = [d.strip() for d in ITEMS]
    script = [f"? {QUERY}", *docs, "", ":rerank off", *docs, "", ":quit"]
    done = run_script(str(path), script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "bert cross-encoder" in done.stderr  # the ready line says what is loaded
    (found,) = tables(done.stdout)  # reranked at once; the score attempt is an error
    want = load_model(path, dtype="float32", progress=False).rerank(QUERY, docs)
    order = sorted(range(3), key=lambda i: -want[i])
    got = rerank_rows(found)
    assert [i for i, _ in got] == order
    np.testing.assert_allclose([s for _, s in got], [want[i] for i in order], rtol=1e-5)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "label-token scores are unavailable" in errors[0]


def test_an_embedder_ranks_by_similarity(minilm, tmp_path):
    from sentence_transformers import SentenceTransformer

    docs = ["The river runs past the house.", "Stocks fell sharply.", "A house by the water"]
    done = run_script(str(minilm), [f"? {QUERY}", *docs, "", ":top 2", *docs, ""], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "bert embedder, mean pooling" in done.stderr
    full, top = tables(done.stdout)
    model = SentenceTransformer(str(minilm), device="cpu")
    want = model.similarity(model.encode([QUERY]), model.encode(docs))[0].numpy()
    order = sorted(range(3), key=lambda i: -want[i])
    got = rerank_rows(full)
    assert [i for i, _ in got] == order
    np.testing.assert_allclose([s for _, s in got], [want[i] for i in order], atol=1e-5)
    assert rerank_rows(top) == got[:2]


# Make the pty the controlling terminal (so Ctrl-C sends SIGINT), then become the program. Done
# in the child rather than with preexec_fn, which forks the multithreaded (JAX) test process.
# SIGINT is made deliverable first, as at a person's terminal: a test run started in the
# background of a non-interactive shell (`pytest ... &`) ignores it, exec keeps it ignored, and
# Python then installs no KeyboardInterrupt handler, so the program would never see Ctrl-C.
ADOPT_TERMINAL = (
    "import fcntl, os, signal, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT]); "
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

    def expect(self, pattern: str, timeout: float = 120) -> re.Match:
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
        plain = term.expect(r"(?s)\n(  # .*?)\n2 items, \d+ prompt tokens \(\d+ cached\)").group(1)
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
        soft = term.expect(r"(?s)\n(  # .*?)\n2 items, \d+ prompt tokens \(\d+ cached\)").group(1)
        term.expect(r"score> ")
        os.write(term.fd, b"\x03")  # Ctrl-C: a clean exit, history saved, no traceback
        assert term.proc.wait(timeout=120) == 130
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
        timeout=300,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("error: ")
    assert "Traceback" not in done.stderr
