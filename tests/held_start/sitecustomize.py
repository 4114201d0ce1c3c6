"""Imported at the start of every Python process whose path holds this directory (the tests put
it there for a server they start): the device runners' start-up compile waits until the file
named by `HELD_START_GATE` exists, so that a test sees the server while it is starting for as
long as it needs to, instead of racing the compile."""

import os
import time
from pathlib import Path

GATE = os.environ.get("HELD_START_GATE")
DEADLINE_S = 300  # a test that never opens the gate fails on its own deadline, not this one

if GATE:
    from engine.runner import RunnerState

    compile_grid = RunnerState.warm_up

    def held_warm_up(self, *args, **kwargs):
        give_up = time.monotonic() + DEADLINE_S
        while not Path(GATE).exists() and time.monotonic() < give_up:
            time.sleep(0.05)
        return compile_grid(self, *args, **kwargs)

    RunnerState.warm_up = held_warm_up
