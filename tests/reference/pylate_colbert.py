"""PyLate's ColBERT encodings and MaxSim scores of the tiny ColBERT directories of
`bench.colbert_models`, written to `pylate_colbert.json` beside this script: the reference
`tests/test_colbert.py` checks the engine against.

PyLate 1.6 pins sentence-transformers 5.3 and transformers <= 5.3, so it runs in a virtual
environment of its own (from the repository root):

    python -m venv /tmp/pylate
    /tmp/pylate/bin/pip install torch==2.13.0 sentence-transformers==5.3.0 transformers==5.3.0 \
        datasets accelerate pandas ujson==5.12.0
    /tmp/pylate/bin/pip install --no-deps pylate==1.6.0   # its index libraries are not needed
    /tmp/pylate/bin/python tests/reference/pylate_colbert.py

The directories are written from seeds and a fixed vocabulary, so the test writes the same ones.
"""

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from bench.colbert_models import write_colbert  # noqa: E402

# name -> write_colbert's arguments
VARIANTS = {
    "pylate": dict(seed=1),
    "attend": dict(seed=2, attend_expansion=True, bias=True),
    "no-expansion": dict(seed=3, expand=False),
    "stanford": dict(seed=4, format="stanford"),
}
QUERIES = [
    "what is a quick brown fox?",
    "the dogs run",
    "which river bank has green trees and blue water for fish at night in the city",
]
DOCUMENTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A river bank, with trees: green, red & blue!",
    "Money in the bank; the school book (paper) is red.",
    "the city road runs to the town and the train runs over the river at night "
    "when the moon and the star light the dark sky over the house and the school",
    "zebra unknown words %",
]


def main() -> None:
    import pylate
    from pylate import models
    from pylate.scores import colbert_scores

    out = {"pylate": pylate.__version__, "queries": QUERIES, "documents": DOCUMENTS}
    with tempfile.TemporaryDirectory() as tmp:
        for name, options in VARIANTS.items():
            path = write_colbert(Path(tmp) / name, **options)
            model = models.ColBERT(str(path), device="cpu")
            queries = model.encode(QUERIES, is_query=True, convert_to_numpy=False)
            documents = model.encode(DOCUMENTS, is_query=False, convert_to_numpy=False)
            scores = [
                [float(colbert_scores(q[None], d[None])[0, 0]) for d in documents] for q in queries
            ]
            out[name] = {
                "queries": [q.tolist() for q in queries],
                "documents": [d.tolist() for d in documents],
                "scores": scores,
            }
    (HERE / "pylate_colbert.json").write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
