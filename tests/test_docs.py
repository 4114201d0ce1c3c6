"""The documentation: a short README (the site's home page) and the pages of `docs/`, built as a
MkDocs site with `--strict`, so a broken link, a missing anchor or a page left out of the
navigation fails here."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README_LINES = 150


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES, len(lines)


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
