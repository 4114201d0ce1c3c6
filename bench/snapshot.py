"""Scores to compare two checkouts bit for bit: a refactor that must change nothing is checked by
running this before and after and comparing the files.

    python -m bench snapshot OUT.npz [--compare BEFORE.npz] [--quick]

In f32 and bf16, through the engine: W1 and W2 on the default model (`Engine.score`; `--quick`
shrinks both), its recipe rerank with `max_tokens_per_doc`; and for a cross-encoder (the
`minilm-l6` shape) and a decoder classifier (the `qwen3-cls-tiny` shape), `Engine.rerank` (raw),
`Engine.score_pairs` with a cut and `load_model().rerank`; for the real all-MiniLM-L6-v2
embedder, `Engine.embed` (with a Matryoshka-style cut and truncation), `Engine.embed_tokens` and
their `load_model()` twins. `--compare` prints the arrays that
differ and exits 1 when any does.

Compare with `--dense` fixed (e.g. `--dense xla`) on both sides: the default dense path is the
one measured fastest per weight shape at start, which a loaded machine can pick differently from
run to run, and another path rounds bf16 differently.
"""

import argparse
import sys

import numpy as np
import trio

from bench import common
from bench.embed import model_dir as embedder_dir
from bench.embed import texts_of
from bench.shapes import shape_dir
from bench.workloads import SUFFIX, rerank_pairs, text_of_tokens
from engine import EngineConfig, default_model_path, load_model, open_engine

QUICK = dict(docs=8, prompt_tokens=100, items=8)
SHORT_QUERY = "Where does the fox jump?"  # the small tokenizers' pairs stay within 512 tokens


def parse(argv):
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("out", help="the .npz file written")
    p.add_argument("--compare", default=None, help="an earlier snapshot to compare with")
    p.add_argument("--docs", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--items", type=int, default=500)
    return common.parse_args(p, argv, QUICK)


def main(argv=None) -> dict:
    args = parse(argv)
    scores: dict[str, np.ndarray] = {}
    for dtype in ("float32", "bfloat16"):
        trio.run(_decoder, args, dtype, scores)
        for name in ("minilm-l6", "qwen3-cls-tiny"):
            trio.run(_reranker, args, name, dtype, scores)
        trio.run(_embedder, args, dtype, scores)
    np.savez(args.out, **scores)
    print(f"{len(scores)} arrays -> {args.out}")
    if args.compare:
        differ = compare(dict(np.load(args.compare)), scores)
        print("identical" if not differ else f"differ: {', '.join(differ)}")
        if differ:
            sys.exit(1)
    return scores


def compare(before: dict, after: dict) -> list[str]:
    """The names of the arrays that differ (or that only one side has)."""
    names = sorted(set(before) | set(after))
    return [n for n in names if n not in before or n not in after or not _same(before[n], after[n])]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a, b)


def _config(args, path, dtype: str) -> EngineConfig:
    return EngineConfig(
        model=str(path), dtype=dtype, dense=args.dense, precompile=False, progress=False
    )


async def _decoder(args, dtype: str, out: dict) -> None:
    async with open_engine(_config(args, args.model or default_model_path(), dtype)) as engine:
        tok = engine.tokenizer
        query, docs = rerank_pairs(tok, seed=0, docs=args.docs, query_tokens=25,
                                   doc_tokens=(130, 230))  # fmt: skip
        labels = [tok.encode(" yes").ids[0], tok.encode(" no").ids[0]]
        w1 = await engine.score(query, [d + SUFFIX for d in docs], labels)
        rng = np.random.default_rng(1)
        prompt = text_of_tokens(rng, tok, args.prompt_tokens)
        items = [text_of_tokens(rng, tok, 20) for _ in range(args.items)]
        w2 = await engine.score(prompt, items, labels)
        ranked = await engine.rerank(query, docs[:16], raw_scores=True, max_tokens_per_doc=100)
    out[f"w1-{dtype}"] = np.array(w1.scores)
    out[f"w2-{dtype}"] = np.array(w2.scores)
    out[f"rerank-{dtype}"] = np.array([[h.index, h.relevance_score] for h in ranked.results])


async def _reranker(args, shape: str, dtype: str, out: dict) -> None:
    path = shape_dir(shape)
    model = load_model(str(path), dtype=dtype, dense=args.dense, progress=False)
    _, docs = rerank_pairs(model.tokenizer, seed=0, docs=16, query_tokens=25, doc_tokens=(20, 40))
    async with open_engine(_config(args, path, dtype)) as engine:
        ranked = await engine.rerank(SHORT_QUERY, docs, raw_scores=True, max_tokens_per_doc=60)
        pairs = await engine.score_pairs([SHORT_QUERY] * 8, docs[:8], max_tokens_per_doc=30)
    out[f"{shape}-rerank-{dtype}"] = np.array(
        [[h.index, h.relevance_score] for h in ranked.results]
    )
    out[f"{shape}-pairs-{dtype}"] = np.array(pairs.scores)
    out[f"{shape}-offline-{dtype}"] = np.array(model.rerank(SHORT_QUERY, docs, raw_scores=True))


async def _embedder(args, dtype: str, out: dict) -> None:
    path = embedder_dir(argparse.Namespace(model=None, shape=None, kind="dense"))  # the real one
    model = load_model(str(path), dtype=dtype, dense=args.dense, progress=False)
    texts = texts_of(model.tokenizer, 24, seed=2)
    async with open_engine(_config(args, path, dtype)) as engine:
        dense = await engine.embed(texts, truncate=True)
        cut = await engine.embed(texts[:8], max_tokens=16, truncate=True, dimensions=384)
        tokens = await engine.embed_tokens(texts[:4])
    out[f"embed-{dtype}"] = np.asarray(dense.embeddings)
    out[f"embed-cut-{dtype}"] = np.asarray(cut.embeddings)
    out[f"embed-tokens-{dtype}"] = np.concatenate(tokens.embeddings)
    out[f"embed-offline-{dtype}"] = model.embed(texts, truncate=True)
    out[f"embed-tokens-offline-{dtype}"] = np.concatenate(model.embed_tokens(texts[:4]))
