"""Score items against a query from the command line.

    python -m engine "Is Paris in France?" " Yes, it is." " Paris is in Texas."

Prints one JSON line per item with the probability of each label (default labels " yes" and
" no"; `--label` repeats to choose others, each must be a single token).
"""

import argparse
import json
import sys
import time

from engine.device.program import DTYPES
from engine.offline import load_model


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine", description=__doc__.split("\n")[0])
    p.add_argument("query")
    p.add_argument("items", nargs="+")
    p.add_argument("--model", default=None, help="a .gguf file or HF directory (default: SmolLM2)")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--label", action="append", dest="labels", help="label text (one token)")
    p.add_argument("--softmax", action="store_true", help="normalise over the labels")
    p.add_argument("--item-first", action="store_true", help="score item + query")
    return p


def label_ids(tokenizer, labels: list[str]) -> list[int]:
    """The token id of each label text; SystemExit naming a label that is not one token."""
    ids = []
    for text in labels:
        enc = tokenizer.encode(text, add_special_tokens=False).ids
        if len(enc) != 1:
            raise SystemExit(f"--label {text!r} is {len(enc)} tokens; each label must be one token")
        ids.append(enc[0])
    return ids


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    start = time.perf_counter()
    model = load_model(args.model, dtype=args.dtype)
    labels = args.labels or [" yes", " no"]
    ids = label_ids(model.tokenizer, labels)
    scores = model.score(
        args.query, args.items, ids, apply_softmax=args.softmax, item_first=args.item_first
    )
    for item, row in zip(args.items, scores, strict=True):
        print(json.dumps({"item": item, "scores": dict(zip(labels, row, strict=True))}))
    print(f"scored {len(scores)} items in {time.perf_counter() - start:.2f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
