"""Each peer API's truncation fields, what they cut and which tokens they keep, in one table
(`PEER_FIELDS`), and the one translation of each into the engine's options. The engine cuts once,
on token ids (`engine.host.truncation`, `engine.host.pairs`): "first k" keeps a text's first k
token ids, "last k" its last k, never a cut text tokenised again.
"""

from typing import NamedTuple

from api.errors import ApiError


class PeerField(NamedTuple):
    peer: str
    field: str
    routes: str
    cuts: str  # what a limit applies to
    keeps: str  # which tokens stay
    engine: str  # the engine's options it becomes


PEER_FIELDS = (
    PeerField(
        "Cohere v2, Jina, vLLM",
        "max_tokens_per_doc: k",
        "the rerank routes, vLLM's /score",
        "each document's own tokens (the recipe's or the pair's other tokens stay)",
        "first k",
        "max_tokens_per_doc=k",
    ),
    PeerField(
        "vLLM",
        "truncate_prompt_tokens: k > 0",
        "the rerank routes, vLLM's /score",
        "each query-document sequence, by its document's tokens (a query is never cut)",
        "the document's first tokens, so that the sequence has at most k",
        "max_prompt_tokens=k",
    ),
    PeerField(
        "vLLM",
        "truncate_prompt_tokens: -1",
        "the rerank routes, vLLM's /score",
        "each sequence, to the model's limit",
        "the document's first tokens",
        "truncate=True",
    ),
    PeerField(
        "vLLM",
        "truncate_prompt_tokens: k > 0 (-1: the model's limit), truncation_side",
        "/v1/embeddings, /pooling",
        "each text",
        "last k (truncation_side 'left', the default); 'right': first k",
        "max_tokens=k, truncation_side='left' | 'right'",
    ),
    PeerField(
        "TEI",
        "truncate: true, truncation_direction: Right | Left",
        "/rerank (texts), /embed, /embed_all, /similarity",
        "each pair or text, to the model's limit",
        "Right: first k; Left: last k",
        "truncate=True, truncation_side='right' | 'left'",
    ),
    PeerField(
        "Voyage",
        "truncation: true (a rerank's default)",
        "/v1/rerank, /v1/embeddings",
        "each sequence or text, to the model's limit",
        "first k",
        "truncate=True",
    ),
    PeerField(
        "Cohere",
        "truncate: END | START | NONE (default END)",
        "/v2/embed",
        "each text, to the model's limit",
        "END: first k; START: last k; NONE: refused over it",
        "truncate, truncation_side='right' | 'left'",
    ),
    PeerField(
        "OpenAI",
        "(none)",
        "/v1/embeddings",
        "nothing: a text over the model's limit is refused",
        "",
        "",
    ),
)


def vllm_rerank(truncate_prompt_tokens: int | None) -> dict:
    """vLLM's `truncate_prompt_tokens` of a score or rerank body as `Engine.rerank`'s options:
    -1 fits the model's limit, k > 0 at most k tokens a sequence (0 or None: no cut)."""
    k = truncate_prompt_tokens
    return {"truncate": k == -1, "max_prompt_tokens": k if k is not None and k > 0 else None}


def vllm_embed(
    truncate: bool, truncate_prompt_tokens: int | None = None, side: str | None = None
) -> dict:
    """`Engine.embed`'s truncation options: cut at the end when `truncate`, or keep k tokens
    of vLLM's `truncate_prompt_tokens` (-1: the model's limit), the last k unless vLLM's
    `truncation_side` says "right" (the first k)."""
    k = truncate_prompt_tokens
    if k is None or k == -1:
        cut = {"truncate": truncate or k == -1}
        return cut | ({"truncation_side": side} if side and cut["truncate"] else {})
    if k < 1:
        field = "truncate_prompt_tokens"
        raise ApiError(400, f"{field}: must be -1 or positive", param=field)
    return {"truncate": True, "truncation_side": side or "left", "max_tokens": k}
