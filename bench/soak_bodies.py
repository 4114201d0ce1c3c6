"""What `python -m bench soak` sends and how it checks what comes back: distinct request bodies
over every scoring and embedding route the served model lists (its `/v1/models` card's
`endpoints`) that the soak knows, and for each route the body that is sent alone for the
reference answer and the gap between an answer under load and that reference.

A gap is a multiple of the route's tolerance: at most 1 is correct. Label-token scores are
compared in log space (`bench.parity.TOLERANCE`), every other number by its difference over its
size where that is above 1 (`ABS_TOLERANCE`: absolute for probabilities, cosines and unit
vectors, relative for BGE-M3's summed relevance or a SPLADE weight of 10); strings, keys,
lengths and orders must be equal, but for `VOLATILE` fields.
A rerank is compared by document index against every document's score sent alone (its
`top_n` dropped), so that a near tie may order two documents either way.
"""

import json
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from bench.parity import TOLERANCE, label_ids
from bench.workloads import text_of_tokens

# tolerance of every number but label-token scores, of its size where above 1: f32 as the
# engine's exactness rule asks (packed equals alone), bf16 at its rounding of values of order one
ABS_TOLERANCE = {"float32": 1e-5, "bfloat16": 5e-2}
VOLATILE = frozenset({"id", "created"})  # fields that differ between any two answers


class Context(NamedTuple):
    """What body builders read: the served model's tokenizer and sizes."""

    tokenizer: object
    vocab: int
    labels: list[int]  # " yes", " no"
    query: tuple[int, int]  # fewest, most query tokens
    dtype: str


class Request(NamedTuple):
    path: str
    body: dict
    payload: bytes
    items: int  # the texts or items it carries


class Route(NamedTuple):
    build: Callable  # (rng, Context) -> body
    alone: Callable  # body -> the body sent alone for the reference
    gap: Callable  # (body, reference answer, answer, dtype) -> multiple of the tolerance


def item_count(rng: np.random.Generator, most: int = 32) -> int:
    """1 to `most`, log-uniform: many small requests and some large ones."""
    return min(most, int(np.exp(rng.uniform(0, np.log(most + 1)))))


def token_ids(rng: np.random.Generator, vocab: int, low: int, high: int) -> list[int]:
    return [int(t) for t in rng.integers(0, vocab, int(rng.integers(low, high + 1)))]


def text(rng: np.random.Generator, ctx: Context, low: int, high: int) -> str:
    return text_of_tokens(rng, ctx.tokenizer, int(rng.integers(low, high + 1)))


def texts(rng: np.random.Generator, ctx: Context, most: int = 32, longest: int = 80) -> list:
    return [text(rng, ctx, 3, longest) for _ in range(item_count(rng, most))]


def score_body(rng: np.random.Generator, ctx: Context) -> dict:
    n = item_count(rng)
    if rng.random() < 0.3:
        query = token_ids(rng, ctx.vocab, *ctx.query)
        items = [token_ids(rng, ctx.vocab, 3, 80) for _ in range(n)]
    else:
        query = text(rng, ctx, *ctx.query)
        items = [text(rng, ctx, 3, 80) for _ in range(n)]
    return {
        "query": query,
        "items": items,
        "label_token_ids": ctx.labels,
        "apply_softmax": bool(rng.random() < 0.5),
        "item_first": bool(rng.random() < 0.2),
    }


def rerank_body(rng: np.random.Generator, ctx: Context, documents: str = "documents") -> dict:
    docs = texts(rng, ctx)
    body = {"query": text(rng, ctx, *ctx.query), documents: docs}
    if documents == "documents":  # the OpenAI-style and Cohere routes
        body["return_documents"] = bool(rng.random() < 0.5)
        if rng.random() < 0.5:
            body["top_n"] = int(rng.integers(1, len(docs) + 1))
    else:  # TEI's
        body["return_text"] = bool(rng.random() < 0.5)
    return body


def _log_gap(got, want) -> float:
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = np.abs(np.log(np.asarray(got, np.float64)) - np.log(np.asarray(want, np.float64)))
    return float(np.max(np.nan_to_num(gap, nan=np.inf, posinf=np.inf), initial=0.0))


def score_gap(body: dict, want: dict, got: dict, dtype: str) -> float:
    same = np.shape(got["scores"]) == np.shape(want["scores"])
    return _log_gap(got["scores"], want["scores"]) / TOLERANCE[dtype] if same else np.inf


def scaled(got: float, want: float) -> float:
    """|got - want| over want's size where that is above 1."""
    return abs(got - want) / max(1.0, abs(want))


def _sparse(x) -> dict | None:
    """A sparse vector's {index: value} (TEI's `[{index, value}]`), else None."""
    pairs = isinstance(x, list) and x and all(isinstance(e, dict) for e in x)
    if not pairs or any(e.keys() != {"index", "value"} for e in x):
        return None
    return {e["index"]: e["value"] for e in x}


def json_gap(got, want) -> float:
    """The largest `scaled` difference of two answers' numbers; inf where anything else
    differs (keys, lengths, strings, types), `VOLATILE` fields aside. A sparse vector's absent
    entries are zeros: a weight that rounds to zero in one batch and not in another is a
    difference of its size, not of shape."""
    sparse = _sparse(want), _sparse(got)
    if None not in sparse:
        return max(
            (scaled(sparse[1].get(i, 0.0), sparse[0].get(i, 0.0)) for i in set().union(*sparse)),
            default=0.0,
        )
    if isinstance(want, dict):
        if not isinstance(got, dict) or got.keys() != want.keys():
            return np.inf
        return max((json_gap(got[k], want[k]) for k in want if k not in VOLATILE), default=0.0)
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return np.inf
        return max(map(json_gap, got, want), default=0.0)
    number = (int, float)
    if isinstance(want, number) and not isinstance(want, bool):
        if not isinstance(got, number) or isinstance(got, bool):
            return np.inf
        return scaled(float(got), float(want))
    return 0.0 if got == want else np.inf


def values_gap(body: dict, want, got, dtype: str) -> float:
    return json_gap(got, want) / ABS_TOLERANCE[dtype]


def _hits(answer) -> list[tuple[int, float, object]]:
    """(index, score, echoed text or None) of each result, in the answer's order."""
    results = answer["results"] if isinstance(answer, dict) else answer
    out = []
    for r in results:
        score = r["relevance_score"] if "relevance_score" in r else r["score"]
        echo = r.get("document", r.get("text"))
        out.append((r["index"], score, echo))
    return out


def rerank_gap(body: dict, want, got, dtype: str) -> float:
    """Every document's score sent alone (`want`) against the answer: the top_n best, in
    order, their texts echoed when asked; a left-out document may beat a kept one only within
    the tolerance."""
    documents = body.get("documents") or body["texts"]
    reference = {i: s for i, s, _ in _hits(want)}
    hits = _hits(got)
    index = [i for i, _, _ in hits]
    scores = [s for _, s, _ in hits]
    top_n = min(body.get("top_n") or len(documents), len(documents))
    if len(set(index)) != len(index) or len(index) != top_n or scores != sorted(scores)[::-1]:
        return np.inf
    echo = body.get("return_documents", body.get("return_text"))
    echoed = [e["text"] if isinstance(e, dict) else e for _, _, e in hits]
    if echoed != [documents[i] if echo else None for i in index]:
        return np.inf
    tol = ABS_TOLERANCE[dtype]
    gap = max(scaled(s, reference[i]) for i, s, _ in hits) / tol
    left_out = [reference[i] for i in reference if i not in set(index)]
    if left_out and max(left_out) > min(scores):  # overtaken: only in a near tie
        gap = max(gap, scaled(min(scores), max(left_out)) / tol)
    return gap


def _all_documents(body: dict) -> dict:
    return {k: v for k, v in body.items() if k != "top_n"}


def _same(body: dict) -> dict:
    return body


def _embeddings(rng, ctx) -> dict:
    return {"input": texts(rng, ctx), "encoding_format": "float"}


def _cohere_embed(rng, ctx) -> dict:
    kind = ["search_document", "search_query", "classification", "clustering"]
    return {
        "texts": texts(rng, ctx),
        "input_type": kind[int(rng.integers(len(kind)))],
        "embedding_types": ["float"],
    }


def _tei_embed(rng, ctx) -> dict:
    return {"inputs": texts(rng, ctx), "normalize": bool(rng.random() < 0.5)}


def _tei_inputs(rng, ctx) -> dict:  # token vectors, sparse vectors: fewer, shorter texts
    return {"inputs": texts(rng, ctx, most=8, longest=40)}


def _hybrid(rng, ctx) -> dict:  # any non-empty subset of the three outputs
    body = _tei_inputs(rng, ctx)
    outputs = {"dense": True, "sparse": True, "multi": True}
    while True:
        chosen = {k: bool(rng.random() < 0.6) for k in outputs}
        if any(chosen.values()):
            return body | chosen


def _similarity(rng, ctx) -> dict:
    return {"inputs": {"source_sentence": text(rng, ctx, *ctx.query), "sentences": texts(rng, ctx)}}


ROUTES: dict[str, Route] = {
    "/v1/score": Route(score_body, _same, score_gap),
    "/v1/rerank": Route(rerank_body, _all_documents, rerank_gap),
    "/v2/rerank": Route(rerank_body, _all_documents, rerank_gap),
    "/rerank": Route(lambda rng, ctx: rerank_body(rng, ctx, "texts"), _same, rerank_gap),
    "/v1/embeddings": Route(_embeddings, _same, values_gap),
    "/v2/embed": Route(_cohere_embed, _same, values_gap),
    "/embed": Route(_tei_embed, _same, values_gap),
    "/embed_all": Route(_tei_inputs, _same, values_gap),
    "/embed_sparse": Route(_tei_inputs, _same, values_gap),
    "/embed_hybrid": Route(_hybrid, _same, values_gap),
    "/similarity": Route(_similarity, _same, values_gap),
}


def items_of(body: dict) -> int:
    for key in ("items", "documents", "texts", "input"):
        if key in body:
            return len(body[key])
    inputs = body["inputs"]
    return len(inputs["sentences"]) if isinstance(inputs, dict) else len(inputs)


# the routes whose bodies name the model that answers them (the others' go to the server's
# default model for the route: `/v1/models`' `default_endpoints`)
NAMED = frozenset({"/v1/score", "/v1/rerank", "/v2/rerank", "/v1/embeddings", "/v2/embed"})


def request_pool(
    tokenizer,
    vocab: int,
    endpoints: list[str],
    count: int,
    seed: int,
    dtype: str,
    query=(5, 60),
    model: str | None = None,
) -> list[Request]:
    """`count` distinct requests spread evenly over the soak's routes among `endpoints`, in
    turn; queries of `query` tokens (fewest, most); with `model`, the bodies of `NAMED` routes
    name it."""
    paths = [p for p in ROUTES if p in endpoints]
    if not paths:
        raise SystemExit(f"the model serves none of the soak's routes: {sorted(ROUTES)}")
    rng = np.random.default_rng(seed)
    ctx = Context(tokenizer, vocab, label_ids(tokenizer), tuple(query), dtype)
    out = []
    for i in range(count):
        path = paths[i % len(paths)]
        body = ROUTES[path].build(rng, ctx)
        if model is not None and path in NAMED:
            body["model"] = model
        out.append(Request(path, body, json.dumps(body).encode(), items_of(body)))
    return out
