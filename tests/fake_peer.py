"""A stand-in for `bench/peer_vllm.py` under `--peer-python`: the same JSON protocol, answered by
transformers (f32, on the request's own token ids) instead of vLLM, so the bench's peer side is
tested where vLLM is not installed.

Run as `python fake_peer.py PEER_SCRIPT (--version | REQUEST ANSWER)`. It copies each request to
`$FAKE_PEER_RECORD` when set; `$FAKE_PEER_MODE` `crash` fails (exit 1) after `--version`,
`bad-answer` answers one row of log-probs too few. The best timed pass "takes" `PASS_S` seconds.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VERSION = "0.0-fake"
PASS_S = 0.25


def main(script: str, *argv: str) -> None:
    assert Path(script).name == "peer_vllm.py", script
    if argv == ("--version",):
        print(VERSION)
        return
    request_path, answer_path = argv
    request = json.loads(Path(request_path).read_text())
    if record := os.environ.get("FAKE_PEER_RECORD"):
        Path(record).write_text(json.dumps(request))
    mode = os.environ.get("FAKE_PEER_MODE", "ok")
    if mode == "crash":
        sys.exit("RuntimeError: the fake peer crashed")
    logprobs = label_logprobs(request)
    if mode == "bad-answer":
        logprobs = logprobs[:-1]
    Path(answer_path).write_text(json.dumps(answer(request, logprobs)))


def label_logprobs(request: dict) -> np.ndarray:
    """transformers' label log-probs over the vocabulary, or renormalised over the labels for
    the classify API (as vLLM's pooling runner gives them)."""
    from bench.baseline import hf_label_logprobs, load_transformers

    model = load_transformers(Path(request["model"]), request["dtype"])
    out = hf_label_logprobs(model, request["sequences"], request["labels"])
    if request["api"] == "classify":
        out = out - np.logaddexp.reduce(out, axis=1, keepdims=True)
    return out


def answer(request: dict, logprobs: np.ndarray) -> dict:
    n = len(request["sequences"])
    return {
        "name": "vllm",
        "version": VERSION,
        "api": request["api"],
        "normalized_over": "labels" if request["api"] == "classify" else "vocab",
        "times_s": [PASS_S * (k + 1) for k in range(request["repeats"])][::-1],  # best last
        "best_s": PASS_S,
        "items_per_s": n / PASS_S,
        "startup_s": 1.0,
        "warmup_s": 0.5,
        "logprobs": logprobs.tolist(),
        "settings": {"dtype": request["dtype"], "enable_prefix_caching": True},
    }


if __name__ == "__main__":
    main(*sys.argv[1:])
