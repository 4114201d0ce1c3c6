"""The REPL's trio loop: read a line, turn it into an action, run that against the engine,
print the result; user and engine errors are printed and the loop goes on."""

import shutil
from collections.abc import Callable

import numpy as np
import trio

from engine.capabilities import Ability
from engine.embed import prompt_named
from engine.engine import Engine
from engine.errors import EngineError
from engine.repl.format import format_footer, format_rerank, format_scores, format_stats
from engine.repl.session import Action, Embed, Quit, Rerank, Say, Score, Session, ShowStats
from engine.results import RerankHit


async def perform(engine: Engine, action: Action, columns: int) -> str:
    """Run one action against the engine; the text to print."""
    match action:
        case Say(text):
            return text
        case ShowStats():
            return format_stats(engine.stats())
        case Score():
            return await _score(engine, action, columns)
        case Rerank():
            return await _rerank(engine, action, columns)
        case Embed():
            return await _embed(engine, action, columns)
    raise TypeError(f"not an action: {action!r}")


async def _score(engine: Engine, action: Score, columns: int) -> str:
    r = await engine.score(
        action.query,
        action.items,
        action.label_ids,
        apply_softmax=action.apply_softmax,
        item_first=action.item_first,
    )
    foot = format_footer(len(r.scores), "items", r.prompt_tokens, r.cached_tokens, r.timings.total)
    return f"{format_scores(action, r.scores, columns)}\n{foot}"


async def _rerank(engine: Engine, action: Rerank, columns: int) -> str:
    r = await engine.rerank(
        action.query, action.documents, top_n=action.top_n, instruction=action.instruction
    )
    foot = format_footer(
        len(action.documents), "documents", r.prompt_tokens, r.cached_tokens, r.timings.total
    )
    return f"{format_rerank(action.documents, r.results, columns)}\n{foot}"


async def _embed(engine: Engine, action: Embed, columns: int) -> str:
    """The documents by the cosine similarity of their vectors to the query's (the query given
    the model's "query" prompt where it has one), best first; a sparse encoder's by
    `_embed_sparse`."""
    if engine.capabilities.offers(Ability.EMBED_SPARSE):
        return await _embed_sparse(engine, action, columns)
    query = await engine.embed([action.query], prompt_name=prompt_named(engine.task, "query"))
    docs = await engine.embed(action.documents)
    vectors, q = docs.embeddings, query.embeddings[0]
    cosine = vectors @ q / np.maximum(np.linalg.norm(vectors, axis=1) * np.linalg.norm(q), 1e-12)
    order = np.argsort(-cosine, kind="stable")[: action.top_n]
    hits = [RerankHit(index=int(i), relevance_score=float(cosine[i])) for i in order]
    tokens, cached = (
        query.prompt_tokens + docs.prompt_tokens,
        query.cached_tokens + docs.cached_tokens,
    )
    seconds = query.timings.total + docs.timings.total
    foot = format_footer(len(action.documents), "documents", tokens, cached, seconds)
    return f"{format_rerank(action.documents, hits, columns, 'cosine')}\n{foot}"


TERMS = 8  # a sparse vector's terms shown


async def _embed_sparse(engine: Engine, action: Embed, columns: int) -> str:
    """The documents by the dot product of their sparse vectors with the query's (each given
    the model's "query" or "document" prompt where it has one), best first, and under the
    table each text's heaviest terms as tokens."""
    query = await engine.embed_sparse(
        [action.query], prompt_name=prompt_named(engine.task, "query")
    )
    docs = await engine.embed_sparse(
        action.documents, prompt_name=prompt_named(engine.task, "document")
    )
    q = dict(zip(*map(np.ndarray.tolist, query.embeddings[0]), strict=True))
    dots = [
        sum(q.get(i, 0.0) * w for i, w in zip(*map(np.ndarray.tolist, v), strict=True))
        for v in docs.embeddings
    ]
    order = np.argsort(-np.asarray(dots), kind="stable")[: action.top_n]
    hits = [RerankHit(index=int(i), relevance_score=float(dots[i])) for i in order]
    table = format_rerank(action.documents, hits, columns, "dot")
    terms = [f"query: {_terms(engine, query.embeddings[0])}"]
    terms += [f"{h.index}: {_terms(engine, docs.embeddings[h.index])}" for h in hits]
    tokens = query.prompt_tokens + docs.prompt_tokens
    seconds = query.timings.total + docs.timings.total
    foot = format_footer(len(action.documents), "documents", tokens, 0, seconds)
    return "\n".join([table, *terms, foot])


def _terms(engine: Engine, vector) -> str:
    """A sparse vector's `TERMS` heaviest entries as "token weight", heaviest first."""
    top = np.argsort(-vector.values, kind="stable")[:TERMS]
    ids = [int(vector.indices[i]) for i in top]  # one past the tokenizer's: shown by number
    tokens = [engine.tokenizer.id_to_token(i) or f"[{i}]" for i in ids]
    return "  ".join(f"{t} {vector.values[i]:.2f}" for t, i in zip(tokens, top, strict=True))


async def serve(
    engine: Engine,
    session: Session,
    read_line: Callable[[str], str | None],
    write: Callable[[str], None],
    error: Callable[[str], None],
) -> None:
    """Read lines until `:quit` or end of input (None), printing each result or `error: ...`.

    `read_line(prompt)` blocks, so it runs in a worker thread; end of input first scores
    whatever items are still pending.
    """
    while True:
        line = await trio.to_thread.run_sync(read_line, session.prompt(), abandon_on_cancel=True)
        try:
            action = session.handle("" if line is None else line)
            if isinstance(action, Quit):
                return
            if action is not None:
                write(await perform(engine, action, shutil.get_terminal_size((100, 24)).columns))
        except (ValueError, EngineError) as e:
            error(f"error: {e}")
        if line is None:
            return
