"""`api.app:app` with device faults injected, for `python -m bench soak --fault-every N`: while
the file `SOAK_FAULT_ARM` exists, every N-th batch that answers requests fails in its device
program's `run` (as a device error would: the runner's own recovery runs), and the requests it
carried are appended to `SOAK_FAULT_LOG` as one JSON line per failed batch. Only the soak serves
it: `hypercorn bench.faulty_app:app`.
"""

import itertools
import json
import os
import threading
from pathlib import Path

from api.app import app
from engine.runner import RunnerState

EVERY = int(os.environ["SOAK_FAULT_EVERY"])
ARM = Path(os.environ["SOAK_FAULT_ARM"])
LOG = Path(os.environ["SOAK_FAULT_LOG"])

_lock = threading.Lock()
_batches = itertools.count(1)
_execute = RunnerState.execute


class InjectedFault(RuntimeError):
    pass


class _Failing:
    """A device program whose `run` raises; everything else is the program's."""

    def __init__(self, program):
        self.program = program

    def run(self, inputs, output=None):
        raise InjectedFault("injected device fault")

    def __getattr__(self, name):
        return getattr(self.program, name)


def execute(self: RunnerState, batch):
    with _lock:
        fail = bool(batch.rows) and ARM.exists() and next(_batches) % EVERY == 0
        if fail:
            # a request's id is its engine's: with several models, named by runner too
            requests = sorted({f"{id(self)}:{request}" for request, _ in batch.rows})
            with LOG.open("a") as log:
                log.write(json.dumps({"batch": batch.id, "requests": requests}) + "\n")
    if not fail:
        return _execute(self, batch)
    program, self.program = self.program, _Failing(self.program)
    try:
        return _execute(self, batch)
    finally:
        self.program = program


RunnerState.execute = execute

__all__ = ["app"]
