"""What `python -m bench embed --kind` measures: for each kind of embedding, the model it runs
by default, the engine's verb, the reference library's encoder (built once, then called per
batch size) and how the two sides' answers are compared.

    dense    Engine.embed          SentenceTransformer.encode
    sparse   Engine.embed_sparse   SparseEncoder.encode          (a SPLADE model)
    bge-m3   Engine.embed_hybrid   BGEM3FlagModel.encode with return_dense, return_sparse and
                                   return_colbert_vecs (all three from one forward each side)
    multi    Engine.embed_multi    PyLate's ColBERT.encode(is_query=False), in PyLate's own
                                   Python (`--pylate-python`, `bench.pylate_worker`): documents
"""

import itertools
import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np


class Kind(NamedTuple):
    shape: str | None  # the default `--shape` (None: the real all-MiniLM-L6-v2)
    verb: str  # the `Engine` method timed
    baseline: str  # the reference's name in the report
    # (path, args, the engine side's facts) -> encode(texts, batch_size); texts cut where the
    # engine cuts them (its `max_seq_length`)
    encoder: Callable
    compare: Callable  # (engine's answer, baseline's answer) -> report fields
    terms: Callable  # engine's answer -> each text's non-zero sparse terms


def _dense_encoder(path: Path, args, eng: dict):
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(
        str(path), device=args.baseline_device, model_kwargs={"dtype": getattr(torch, args.dtype)}
    )
    return lambda texts, bs: model.encode(
        texts, batch_size=bs, prompt_name=eng["prompt_name"], convert_to_numpy=True
    )


def _sparse_encoder(path: Path, args, eng: dict):
    import torch
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(
        str(path), device=args.baseline_device, model_kwargs={"dtype": getattr(torch, args.dtype)}
    )

    def encode(texts, bs):
        given = dict(batch_size=bs, prompt_name=eng["prompt_name"], convert_to_tensor=True)
        coo = model.encode(texts, **given)
        return as_pairs(coo, len(texts))

    return encode


def _m3_encoder(path: Path, args, eng: dict):
    from FlagEmbedding import BGEM3FlagModel

    model = BGEM3FlagModel(
        str(path),
        use_fp16=False,
        use_bf16=args.dtype == "bfloat16",
        devices=args.baseline_device,
    )
    return lambda texts, bs: model.encode(
        texts,
        batch_size=bs,
        max_length=eng["config"].max_length,
        return_dense=True,
        return_sparse=True,
        return_colbert_vecs=True,
    )


class Timed(NamedTuple):
    """An encoder's answer with the time its own call took (one run in another process)."""

    answer: object
    seconds: float


def _pylate_encoder(path: Path, args, eng: dict):
    """PyLate's `ColBERT.encode` of documents in PyLate's own Python (`bench.pylate_worker`),
    each call timed there."""
    if not args.pylate_python:
        raise SystemExit(
            "--kind multi compares with PyLate, which needs a virtual environment of its own "
            "(tests/reference/pylate_colbert.py says how): give its python as --pylate-python"
        )
    worker = Path(__file__).with_name("pylate_worker.py")
    command = [args.pylate_python, str(worker), str(path), args.dtype]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    json.loads(process.stdout.readline())  # loaded
    scratch = Path(tempfile.mkdtemp())

    def encode(texts, bs):
        out = scratch / "vectors.npz"
        ask = {"texts": list(texts), "batch_size": bs, "out": str(out)}
        process.stdin.write(json.dumps(ask) + "\n")
        process.stdin.flush()
        seconds = json.loads(process.stdout.readline())["seconds"]
        with np.load(out) as saved:
            return Timed([saved[f"t{i}"] for i in range(len(texts))], seconds)

    return encode


def as_pairs(coo, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """A sparse COO tensor [N, V]'s rows as (ids, values) pairs."""
    coo = coo.coalesce()
    rows, cols = coo.indices().numpy()
    values = coo.values().float().numpy()
    starts = np.searchsorted(rows, np.arange(n + 1))
    return [(cols[a:b], values[a:b]) for a, b in itertools.pairwise(starts)]


def sparse_diff(ours, theirs) -> tuple[float, int]:
    """The largest difference of a weight (a term one side lacks counted as 0) and the texts
    whose non-zero terms differ, between two lists of (ids, values)."""
    diff, mismatches = 0.0, 0
    for (ids, got), (their_ids, their_values) in zip(ours, theirs, strict=True):
        mine = dict(zip(np.asarray(ids).tolist(), got, strict=True))
        other = dict(zip(np.asarray(their_ids).tolist(), their_values, strict=True))
        mismatches += mine.keys() != other.keys()
        for i in mine.keys() | other.keys():
            diff = max(diff, abs(float(mine.get(i, 0.0)) - float(other.get(i, 0.0))))
    return diff, mismatches


def _compare_dense(ours, theirs) -> dict:
    return {"max_abs_component_diff_vs_baseline": float(np.abs(ours - theirs).max())}


def _compare_sparse(ours, theirs) -> dict:
    diff, mismatches = sparse_diff(ours, theirs)
    return {"max_abs_component_diff_vs_baseline": diff, "support_mismatches": mismatches}


def _compare_m3(ours, theirs) -> dict:
    lexical = [
        (np.array([int(k) for k in w], np.int64), np.float32(list(w.values())))
        for w in theirs["lexical_weights"]
    ]
    diff, mismatches = sparse_diff(ours.sparse, lexical)
    pairs = zip(ours.multi, theirs["colbert_vecs"], strict=True)
    multi = max(float(np.abs(a - b).max()) for a, b in pairs)
    dense = float(np.abs(ours.dense - theirs["dense_vecs"]).max())
    return {
        "max_abs_component_diff_vs_baseline": dense,
        "max_abs_sparse_diff_vs_baseline": diff,
        "max_abs_multi_vector_diff_vs_baseline": multi,
        "support_mismatches": mismatches,
    }


def _compare_multi(ours, theirs) -> dict:
    if [len(a) for a in ours] != [len(b) for b in theirs]:
        return {"max_abs_component_diff_vs_baseline": float("inf")}
    pairs = zip(ours, theirs, strict=True)
    return {"max_abs_component_diff_vs_baseline": max(float(np.abs(a - b).max()) for a, b in pairs)}


def _no_terms(answer) -> list[int]:
    return [0]


KINDS = {
    "dense": Kind(
        None,
        "embed",
        "sentence-transformers SentenceTransformer.encode",
        _dense_encoder,
        _compare_dense,
        _no_terms,
    ),
    "sparse": Kind(
        "splade-bert-base",
        "embed_sparse",
        "sentence-transformers SparseEncoder.encode",
        _sparse_encoder,
        _compare_sparse,
        lambda answer: [len(v.indices) for v in answer],
    ),
    "bge-m3": Kind(
        "bge-m3",
        "embed_hybrid",
        "FlagEmbedding BGEM3FlagModel.encode (dense, sparse, colbert)",
        _m3_encoder,
        _compare_m3,
        lambda answer: [len(v.indices) for v in answer.sparse],
    ),
    "multi": Kind(
        "colbert-bert-base",
        "embed_multi",
        "PyLate ColBERT.encode (documents)",
        _pylate_encoder,
        _compare_multi,
        _no_terms,
    ),
}
