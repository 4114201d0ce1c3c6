"""What every loader returns: an architecture, host parameters and a tokenizer."""

from dataclasses import dataclass

import numpy as np
import tokenizers

from engine.models.config import ModelConfig


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Checkpoint:
    """A loaded model before placement on a device.

    `params` follows the layout in `engine.models.config` with float32 numpy leaves; `source` is
    the file or directory it came from.
    """

    config: ModelConfig
    params: dict[str, np.ndarray | dict[str, np.ndarray]]
    tokenizer: tokenizers.Tokenizer
    source: str
