"""Relevance from vectors: an embedder's rerank, each document vector's cosine similarity to the
query's (`cosine`: what vLLM's score and rerank answer for an embedding model); a ColBERT
rerank, PyLate's MaxSim (`colbert`: for each query vector its largest dot product with the
document's, summed); and a BGE-M3 rerank, FlagEmbedding's `compute_score`. The query and the
documents are each encoded once (the query once for all its documents; BGE-M3's dense, lexical
and multi-vectors from one forward by `Engine.embed_hybrid`), then each BGE-M3 document scores

    dense    its dense vector's dot product with the query's (both unit vectors)
    sparse   the sum over the terms both have of their lexical weights' products
    multi    MaxSim: for each query multi-vector its largest dot product with the document's,
             summed and divided by the query's count

and its relevance is their weighted mean (FlagEmbedding's "colbert+sparse+dense"), with the
weights of `EngineConfig.hybrid_weights`."""

from collections.abc import Sequence

import numpy as np

from engine.results import HybridEmbedResult, SparseVector


def cosine(query: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """Each document vector's (f32[N, D]) cosine similarity to the query's f32[D], f64[N]; 0
    where either vector is zero."""
    q, d = query.astype(np.float64), documents.astype(np.float64).reshape(-1, len(query))
    norms = np.linalg.norm(d, axis=1) * np.linalg.norm(q)
    return np.divide(d @ q, norms, out=np.zeros(len(d)), where=norms > 0)


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """Sum over query vectors f32[n, D] of the largest dot product with the document's
    f32[m, D], over n (f64): BGE-M3's colbert score."""
    best = _best(query, document)
    return float(best.sum() / len(query)) if len(best) else 0.0


def colbert(query: np.ndarray, document: np.ndarray) -> float:
    """PyLate's MaxSim: the sum over query vectors f32[n, D] of the largest dot product with
    the document's f32[m, D] (f64); 0 for a document with no vectors."""
    return float(_best(query, document).sum())


def _best(query: np.ndarray, document: np.ndarray) -> np.ndarray:
    """f64[n]: each query vector's largest dot product with the document's (none without
    vectors on either side)."""
    if len(query) == 0 or len(document) == 0:
        return np.zeros(0)
    return (query.astype(np.float64) @ document.astype(np.float64).T).max(axis=1)


def lexical(a: SparseVector, b: SparseVector) -> float:
    """The sum over the ids both vectors have of their weights' products (f64)."""
    _, i, j = np.intersect1d(a.indices, b.indices, assume_unique=True, return_indices=True)
    return float(np.dot(a.values[i].astype(np.float64), b.values[j].astype(np.float64)))


def relevance(
    query: HybridEmbedResult, documents: HybridEmbedResult, weights: Sequence[float]
) -> np.ndarray:
    """Each document's weighted mean f64[N] of its dense, sparse and multi-vector scores
    against the query (the first and only text of `query`)."""
    dense = documents.dense.astype(np.float64) @ query.dense[0].astype(np.float64)
    sparse = np.array([lexical(query.sparse[0], d) for d in documents.sparse])
    multi = np.array([maxsim(query.multi[0], d) for d in documents.multi])
    w = np.asarray(weights, np.float64)
    return (w[0] * dense + w[1] * sparse + w[2] * multi) / w.sum()


def check_weights(weights: Sequence[float]) -> None:
    """ValueError naming `hybrid_weights` unless they are three non-negative numbers, not all
    0."""
    w = list(weights)
    if len(w) != 3 or any(x < 0 for x in w) or sum(w) <= 0:
        why = "three non-negative weights (dense, sparse, multi), not all 0"
        raise ValueError(f"hybrid_weights: {why}; got {w}")
