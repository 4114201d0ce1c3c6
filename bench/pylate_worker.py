"""PyLate's side of `python -m bench embed --kind multi`, run by PyLate's own Python (PyLate 1.6
pins sentence-transformers 5.3 and transformers <= 5.3: a virtual environment of its own, as
`tests/reference/pylate_colbert.py` sets up). It loads `ColBERT(path)` once, then answers each
line of JSON on stdin, `{"texts": [...], "batch_size": n, "out": file}`, by encoding the texts
as documents (`is_query=False`), saving their vectors to `out` (.npz, one array a text) and
writing `{"seconds": s}`: the encode call's own time.

    PYLATE_PYTHON bench/pylate_worker.py MODEL_DIR DTYPE
"""

import json
import os
import sys
import time

import numpy as np
import torch
from pylate import models


def main() -> None:
    path, dtype = sys.argv[1], sys.argv[2]
    torch.set_num_threads(os.cpu_count())
    model = models.ColBERT(path, device="cpu", model_kwargs={"dtype": getattr(torch, dtype)})
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        start = time.perf_counter()
        vectors = model.encode(
            ask["texts"], batch_size=ask["batch_size"], is_query=False, convert_to_numpy=False
        )
        seconds = time.perf_counter() - start
        arrays = {f"t{i}": v.float().numpy() for i, v in enumerate(vectors)}
        np.savez(ask["out"], **arrays)
        print(json.dumps({"seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
