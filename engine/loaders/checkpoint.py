"""What every loader returns: an architecture, host parameters and a tokenizer; and the task
they make (`engine.tasks`), decided here once."""

from dataclasses import dataclass, field

import numpy as np
import tokenizers

from engine.models.config import ModelConfig
from engine.tasks import Task, task_for


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Checkpoint:
    """A loaded model before placement on a device.

    `params` follows the layout in `engine.models.config` with float32 numpy leaves; `source` is
    the file or directory it came from; `task` what the model computes, from its config.
    """

    config: ModelConfig
    params: dict[str, np.ndarray | dict[str, np.ndarray]]
    tokenizer: tokenizers.Tokenizer
    source: str
    task: Task = field(init=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "task", task_for(self.config))
