"""Deterministic English-like texts for the benchmark workloads."""

import numpy as np

WORDS = (
    "the of and to in is was for on that with as by at from his her it an were are which this be "
    "or has had not but what all when there can more one about their will would been if they "
    "river market system model search result document query answer relevant question report city "
    "energy water history science music language network policy health data study research team "
    "quickly carefully often rarely new old large small early late public private local global "
    "describes explains shows measures improves reduces supports follows compares finds"
).split()


def sentence(rng: np.random.Generator, words: int) -> str:
    return " ".join(rng.choice(WORDS, words)).capitalize() + "."


def text_of_tokens(rng: np.random.Generator, tokenizer, tokens: int) -> str:
    """A text of about `tokens` tokens under `tokenizer`, built sentence by sentence."""
    out = ""
    while len(tokenizer.encode(out, add_special_tokens=False).ids) < tokens:
        out += " " + sentence(rng, int(rng.integers(6, 16)))
    return out


def rerank_pairs(
    tokenizer, *, seed: int, docs: int, query_tokens: int, doc_tokens: tuple[int, int]
):
    """A query of ~`query_tokens` tokens and `docs` documents with lengths from `doc_tokens`."""
    rng = np.random.default_rng(seed)
    query = text_of_tokens(rng, tokenizer, query_tokens)
    lengths = rng.integers(doc_tokens[0], doc_tokens[1] + 1, docs)
    return query, [text_of_tokens(rng, tokenizer, int(n)) for n in lengths]
