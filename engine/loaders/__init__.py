"""Checkpoint loaders: Hugging Face directories and GGUF files, into one `Checkpoint`."""

from pathlib import Path

from engine.loaders.checkpoint import Checkpoint, CheckpointError
from engine.loaders.default import default_embedder_path, default_model_path


def load_checkpoint(path: str | Path | None = None, *, progress: bool = True) -> Checkpoint:
    """Load a `.gguf` file or a Hugging Face directory; `None` loads the default model."""
    path = Path(path) if path is not None else default_model_path()
    if path.is_dir():
        from engine.loaders.hf import load_hf_dir

        return load_hf_dir(path, progress=progress)
    if path.suffix == ".gguf" and path.is_file():
        from engine.loaders.gguf import load_gguf

        return load_gguf(path, progress=progress)
    raise CheckpointError(f"{path}: not a Hugging Face model directory or an existing .gguf file")


__all__ = [
    "Checkpoint",
    "CheckpointError",
    "default_embedder_path",
    "default_model_path",
    "load_checkpoint",
]
