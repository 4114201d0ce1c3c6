"""Run twice by `tests/test_placement.py`, as two processes on 127.0.0.1 that form one JAX
runtime (CPU collectives over gloo): one device program whose weights are sharded over both
processes' devices scores a packed batch; each process prints the label log-probs it holds.

    python -m tests.multi_host PROCESS_ID PORT MODEL_DIR BARRIER_DIR
"""

import json
import sys
import time
from pathlib import Path

import jax
import numpy as np

from engine.device.placement import Placement
from engine.device.program import DeviceProgram


def batch():
    """A packed batch of six sequences sharing a 30-token prefix, and their count."""
    from engine.host import packing, planning
    from engine.host.buckets import make_buckets

    seqs = [[5] * 30 + [i + 3] * (i + 1) for i in range(6)]
    buckets = make_buckets(512, token_budget=256)
    (chunks,) = planning.plan(seqs, token_budget=256, buckets=buckets)
    return packing.pack(seqs, [[1, 2]] * len(seqs), chunks, buckets).inputs, len(seqs)


BARRIER_S = 300  # the peer's load at most: far past any machine's, short of the test's timeout


def barrier(directory: Path, process: int, name: str) -> None:
    """Wait until both processes reach `name` (gloo gives its first collective only 30 s, which
    two processes compiling on a loaded machine may need between them); exits with an error
    when the peer has not come within `BARRIER_S` seconds (it failed or hangs)."""
    (directory / f"{name}-{process}").touch()
    deadline = time.monotonic() + BARRIER_S
    while not (directory / f"{name}-{1 - process}").exists():
        if time.monotonic() > deadline:
            sys.exit(f"process {1 - process} did not reach {name!r} within {BARRIER_S} s")
        time.sleep(0.05)


def main(process: int, port: str, model: str, directory: Path) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
    assert jax.process_count() == 2 and len(jax.devices()) == 2 > len(jax.local_devices())
    from engine.loaders import load_checkpoint

    checkpoint = load_checkpoint(model, progress=False)
    placement = Placement(jax.devices())  # one mesh over both processes
    program = DeviceProgram(checkpoint, dtype="float32", kv_cache_bytes=0, placement=placement)
    inputs, n = batch()
    barrier(directory, process, "loaded")  # what is left before the collectives: one compile
    out = program.run(inputs)  # replicated: each process holds all of it
    print(json.dumps(np.asarray(out.addressable_data(0))[:n, :2].tolist()), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]))
