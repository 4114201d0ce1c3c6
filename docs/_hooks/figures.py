"""MkDocs hooks: the README is the site's home page (its `docs/` links made relative to the site),
and the benchmark figures (`bench/figures/*.png`, kept beside the reports they are drawn from)
are part of the site, at `bench/figures/` as the pages link them."""

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "bench" / "figures"


def on_files(files, config):
    files.append(File.generated(config, "index.md", abs_src_path=str(ROOT / "README.md")))
    for path in sorted(FIGURES.glob("*.png")):
        files.append(File.generated(config, f"bench/figures/{path.name}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "index.md":
        return markdown.replace("](docs/", "](")
    return markdown
