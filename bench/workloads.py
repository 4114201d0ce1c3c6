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


def text_lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    """int[n]: token counts of short texts as real corpora spread them, log-normal around 60
    and cut to 8-256."""
    return np.clip(np.round(rng.lognormal(np.log(60), 0.8, n)), 8, 256).astype(int)


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


# Varied real query/answer pairs for parity checks against the reference implementation.
PAIRS = [
    ("What is the capital of France?", " Paris is the capital and largest city of France."),
    ("What is the capital of France?", " Berlin is known for its museums and nightlife."),
    ("Is Python a programming language?", " Python is a high-level, general-purpose language."),
    ("Is Python a programming language?", " The python is a large constricting snake."),
    ("How many legs does a spider have?", " Spiders have eight legs and two body segments."),
    ("How many legs does a spider have?", " Most insects have six legs."),
    ("Who wrote Hamlet?", " Hamlet is a tragedy written by William Shakespeare around 1600."),
    ("Who wrote Hamlet?", " Pride and Prejudice was written by Jane Austen."),
    ("What is 12 * 12?", " 12 multiplied by 12 equals 144."),
    ("What is 12 * 12?", " The sum of 12 and 12 is 24."),
    ("Does water boil at 100°C at sea level?", " Yes: at 1 atm, water boils at 100 °C."),
    ("Best way to sort a list in Python?", " Use sorted(items) or items.sort(key=len)."),
    ("Best way to sort a list in Python?", " Bake the cake at 180 degrees for 40 minutes."),
    ("Translate 'cat' to French.", " Le chat (the cat) — «chat» en français."),
    ("What is the speed of light?", " About 299,792 km/s in vacuum.\nIt is denoted c."),
    ("日本の首都はどこですか？", " 東京は日本の首都です。"),
]
SUFFIX = " Is the answer relevant? Answer yes or no:"


def bench_corpus(seed: int) -> list[str]:
    """The bench's English-like sentences ending in `SUFFIX`, its word list and " yes"/" no"."""
    rng = np.random.default_rng(seed)
    corpus = [sentence(rng, int(rng.integers(6, 16))) + SUFFIX for _ in range(2000)]
    return corpus + [" ".join(WORDS), " yes no yes no", "Answer yes or no:"]
