"""The documentation: a short README (the site's home page) and the pages of `docs/`, built as a
MkDocs site with `--strict`, so a broken link, a missing anchor or a page left out of the
navigation fails here; and every example in them run as a reader would run it."""

import contextlib
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from bench.colbert_models import write_colbert
from bench.retrieval_models import write_m3, write_splade
from tests.conftest import CORPUS, TINY_ENCODER
from tests.test_api_support import BASE_ENV, hypercorn_server

ROOT = Path(__file__).resolve().parent.parent
README_LINES = 150


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES, len(lines)


REFERENCES = [("configuration", "page"), ("http-reference", "http_page")]  # page, generator


@pytest.mark.parametrize(("page", "generate"), REFERENCES)
def test_the_references_are_generated(page, generate):
    reference = runpy.run_path(str(ROOT / "docs" / "_hooks" / "reference.py"))
    assert (ROOT / "docs" / f"{page}.md").read_text() == reference[generate](), (
        f"docs/{page}.md is out of date: python docs/_hooks/reference.py"
    )


def test_the_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")}
    built = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")}
    assert pages <= built, pages - built
    home = (tmp_path / "site" / "index.html").read_text()
    assert 'href="embeddings/"' in home  # the README's docs/ links, made the site's
    assert (tmp_path / "site" / "bench" / "figures" / "w1-smollm2-bf16.png").is_file()


# -- every example runs -----------------------------------------------------------------------
# Each fenced example of the README and docs/ runs here, as a reader would run it: Python in a
# fresh interpreter, shell in bash, HTTP against a server of the model it names. The line before
# a fence may say `<!-- not run: why -->` (an install, a benchmark of hours, a cluster) or
# `<!-- run against: default | minilm -->` (a server of that model at the URL the example uses).
# A `# OUTPUT: ...` comment in an example is the exact output it must print.

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
MARK = re.compile(r"<!-- (not run|run against): (.+?) -->\s*$")
# a path in an example -> the fixture's
PLACEHOLDERS = {
    "path/to/all-MiniLM-L6-v2": "minilm",
    "path/to/splade-model": "splade",
    "path/to/bge-m3": "m3",
    "path/to/colbert-model": "colbert",
}


class Example(NamedTuple):
    where: str  # file:line
    kind: str  # python, sh, ...
    code: str
    mark: tuple[str, str] | None  # ("not run", why) or ("run against", model)


def examples() -> list[Example]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for m in FENCE.finditer(text):
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = MARK.search(before)
            line = text[: m.start()].count("\n") + 1
            found.append(
                Example(
                    f"{path.relative_to(ROOT)}:{line}",
                    m.group(1),
                    m.group(2),
                    mark.groups() if mark else None,
                )
            )
    return found


EXAMPLES = examples()


def test_every_example_runs_or_says_why_not():
    for ex in EXAMPLES:
        assert ex.kind in ("python", "sh") or (ex.mark and ex.mark[0] == "not run"), ex.where
        if ex.mark and ex.mark[0] == "not run":
            assert len(ex.mark[1]) > 10, f"{ex.where}: say why it is not run"


RUN = [ex for ex in EXAMPLES if not (ex.mark and ex.mark[0] == "not run")]


@pytest.fixture(scope="module")
def splade(tmp_path_factory) -> Path:
    """A tiny random SPLADE model (BERT, max pooling), for the sparse-vector examples."""
    fields = dict(TINY_ENCODER, type_vocab_size=2)
    options = dict(seed=5, corpus=CORPUS, model_max_length=96, vocab=300)
    root = tmp_path_factory.mktemp("splade")
    return write_splade(root / "splade", "BertConfig", fields, "bert", **options)


@pytest.fixture(scope="module")
def m3(tmp_path_factory) -> Path:
    """A tiny random BGE-M3, for the hybrid examples."""
    fields = dict(TINY_ENCODER, type_vocab_size=1, max_position_embeddings=130)
    options = dict(seed=5, corpus=CORPUS, model_max_length=96, vocab=300)
    return write_m3(tmp_path_factory.mktemp("m3") / "m3", fields, **options)


@pytest.fixture(scope="module")
def colbert(tmp_path_factory) -> Path:
    """A tiny random ColBERT model in PyLate's format, for the late-interaction examples."""
    return write_colbert(tmp_path_factory.mktemp("colbert") / "colbert", seed=5)


@pytest.fixture(scope="module")
def servers(minilm, splade, tmp_path_factory):
    """A server per model the examples are run against, started when first asked for."""
    started, stack = {}, contextlib.ExitStack()

    def url(model: str) -> str:
        if model not in started:
            env = dict(BASE_ENV, SCORING_DTYPE="bfloat16")
            if model in ("minilm", "splade"):
                env["SCORING_MODEL"] = str({"minilm": minilm, "splade": splade}[model])
            log = tmp_path_factory.mktemp("docs") / f"{model}.log"
            started[model] = stack.enter_context(hypercorn_server("asyncio", env, log)).url
        return started[model]

    with stack:
        yield url


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """The examples' home: one compile cache for them all, as one reader's machine has."""
    return tmp_path_factory.mktemp("home")


@pytest.mark.slow
@pytest.mark.parametrize("ex", RUN, ids=[ex.where for ex in RUN])
def test_the_example_runs(ex, servers, minilm, splade, m3, colbert, home, tmp_path):
    code = ex.code
    paths = {"minilm": minilm, "splade": splade, "m3": m3, "colbert": colbert}
    for placeholder, fixture in PLACEHOLDERS.items():
        code = code.replace(placeholder, str(paths[fixture]))
    if ex.mark and ex.mark[0] == "run against":
        url = servers(ex.mark[1].strip())
        for written in ("http://127.0.0.1:8000", "127.0.0.1:8000", "localhost:8000"):
            code = code.replace(written, url if written.startswith("http") else url[7:])
    command = [sys.executable, "-c", code] if ex.kind == "python" else ["bash", "-c", code]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCORING_")}
    env |= {"JAX_PLATFORMS": "cpu", "HOME": str(home)}
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, f"{ex.where}:\n{done.stdout}\n{done.stderr}"
    if ex.kind == "sh":
        assert "error" not in done.stdout.lower(), f"{ex.where}:\n{done.stdout}"
    expected = re.search(r"# OUTPUT: (.*)$", code, re.M)
    if expected:
        assert done.stdout.strip() == expected.group(1).strip(), ex.where
