"""Hypothesis on the Engine API (tiny model, f32): random valid requests, sent concurrently and
sharing a prefix, score as one-by-one `ScoringModel.score` does; random invalid ones raise the
documented exception naming the field, without disturbing a valid neighbour.

One engine per test: the property runs in a worker thread of the engine's trio run and submits
through `trio.from_thread`. `PROPERTY_EXAMPLES` raises the examples per property (25).
"""

import os
import re
from typing import Any, NamedTuple

import outcome
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import EngineConfig, InputTooLarge, InvalidInput, load_model, open_engine
from tests.conftest import TINY
from tests.test_api_support import assert_scores, tables_empty

EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "25"))
VOCAB = TINY["vocab_size"]
CONTEXT = TINY["max_position_embeddings"]
MAX_ITEMS = 16
MAX_LABELS = 32  # the widest label bucket
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Request(NamedTuple):
    query: Any
    items: Any
    labels: Any
    apply_softmax: bool = False
    item_first: bool = False

    def options(self) -> dict:
        return {"apply_softmax": self.apply_softmax, "item_first": self.item_first}

    async def score(self, engine):
        return await engine.score(self.query, self.items, self.labels, **self.options())

    def reference(self, model):
        return model.score(self.query, self.items, self.labels, **self.options())


ID = st.integers(0, VOCAB - 1)
TEXT = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=24)
LABELS = st.lists(ID, min_size=1, max_size=5)


def id_lists(low: int, high: int):
    return st.lists(ID, min_size=low, max_size=high)


@st.composite
def valid_request(draw, shared_ids=(), shared_text=""):
    """Text or token ids, 1-6 items (1-24 characters or 1-30 ids), the shared query or one of
    its own."""
    if draw(st.booleans()):
        query = draw(st.just(shared_text) | st.text(max_size=24))
        items = draw(TEXT | st.lists(TEXT, min_size=1, max_size=6))
    else:
        query = draw(st.just(list(shared_ids)) | id_lists(0, 40))
        items = draw(st.lists(id_lists(1, 30), min_size=1, max_size=6))
    return Request(query, items, draw(LABELS), draw(st.booleans()), draw(st.booleans()))


@st.composite
def valid_requests(draw):
    shared_ids, shared_text = draw(id_lists(1, 40)), draw(TEXT)
    return draw(st.lists(valid_request(shared_ids, shared_text), min_size=1, max_size=5))


def run_in_engine(property_fn, path, *, config=None, reference=None, check=lambda e: None):
    """Open an engine on `path` (with `config`) and run the (hypothesis) `property_fn(engine,
    reference)` in a worker thread, so one engine serves every example; then, once it is idle,
    nothing of any request is left and `check(engine)` holds."""
    reference = reference or load_model(path, dtype="float32")
    config = config or EngineConfig(
        model=path,
        dtype="float32",
        token_budget=512,
        max_items_per_request=MAX_ITEMS,
        label_widths=(4, MAX_LABELS),
        compile_cache_dir=None,
        progress=False,
        precompile=False,
    )

    async def main():
        async with open_engine(config) as engine:
            await trio.to_thread.run_sync(property_fn, engine, reference)
            with trio.fail_after(120):
                await engine.wait_idle()
            assert tables_empty(engine)
            check(engine)

    trio.run(main)


async def _gather(engine, requests: list[Request]) -> list[outcome.Outcome]:
    """Every request submitted at once; the outcome of each, in order."""
    results: list[Any] = [None] * len(requests)

    async def one(i: int, r: Request):
        results[i] = await outcome.acapture(r.score, engine)

    async with trio.open_nursery() as nursery:
        for i, r in enumerate(requests):
            nursery.start_soon(one, i, r)
    return results


def submit(engine, requests: list[Request]) -> list[outcome.Outcome]:
    return trio.from_thread.run(_gather, engine, requests)


@PROPERTY
@given(requests=valid_requests())
def _concurrent_equals_one_by_one(engine, reference, requests):
    for r, got in zip(requests, submit(engine, requests), strict=True):
        result = got.unwrap()
        assert_scores(result.scores, r.reference(reference))
        seqs = reference.sequences(r.query, r.items, item_first=r.item_first)
        assert result.prompt_tokens == sum(map(len, seqs))


def test_valid_requests_score_as_the_reference_one_by_one(tiny_path):
    run_in_engine(_concurrent_equals_one_by_one, tiny_path)


# -- invalid requests: each a valid one with one fault, and what it must raise ---------------

BAD_ID = st.integers(VOCAB, 2**40) | st.integers(-(2**40), -1)
NOT_AN_ID = st.sampled_from([True, 1.0, "7", None, [1]])


def _put(draw, values: list, value) -> list:
    at = draw(st.integers(0, len(values)))
    return [*values[:at], value, *values[at:]]


def _item_index(draw, r: Request) -> int:
    return draw(st.integers(0, len(r.items) - 1))


def _replace_item(r: Request, i: int, item) -> Request:
    return r._replace(items=[*r.items[:i], item, *r.items[i + 1 :]])


def no_tokens(draw, r):
    i = _item_index(draw, r)
    bad = _replace_item(r._replace(query=[]), i, [])
    return bad, InvalidInput, rf"^items\[{i}\]: no tokens: the query and the item are both empty"


def item_id_outside_vocab(draw, r):
    i = _item_index(draw, r)
    bad = _replace_item(r, i, _put(draw, r.items[i], draw(BAD_ID)))
    return bad, InvalidInput, rf"^items\[{i}\]: token id outside the vocabulary \[0, {VOCAB}\)"


def query_id_outside_vocab(draw, r):
    bad = r._replace(query=_put(draw, r.query, draw(BAD_ID)))
    return bad, InvalidInput, rf"^query: token id outside the vocabulary \[0, {VOCAB}\)"


def label_outside_vocab(draw, r):
    bad = r._replace(labels=_put(draw, r.labels, draw(BAD_ID)))
    return bad, InvalidInput, r"^label_token_ids: Token ID -?\d+ is out of vocabulary range"


def no_labels(draw, r):
    return r._replace(labels=[]), InvalidInput, r"^label_token_ids: must be a non-empty list"


def not_an_id(draw, r):
    i = _item_index(draw, r)
    bad = _replace_item(r, i, _put(draw, r.items[i], draw(NOT_AN_ID)))
    return bad, InvalidInput, r"^query/items: must be all text .* or all token ids"


def text_and_ids(draw, r):
    bad = r._replace(query=draw(st.text(max_size=8)))
    return bad, InvalidInput, r"^query/items: must be all text .* or all token ids"


def too_many_items(draw, r):
    n = draw(st.integers(MAX_ITEMS + 1, 2 * MAX_ITEMS))
    bad = r._replace(items=[r.items[0]] * n)
    return bad, InputTooLarge, rf"^items: {n} items exceed the limit of {MAX_ITEMS}"


def too_many_labels(draw, r):
    n = draw(st.integers(MAX_LABELS + 1, 2 * MAX_LABELS))
    bad = r._replace(labels=[r.labels[0]] * n)
    return bad, InputTooLarge, rf"^label_token_ids: {n} labels exceed the limit of {MAX_LABELS}"


def over_the_context(draw, r):
    i = _item_index(draw, r)
    n = draw(st.integers(CONTEXT + 1 - len(r.query), CONTEXT + 40))
    bad = _replace_item(r, i, draw(id_lists(n, n)))
    pattern = rf"^items\[{i}\]: sequence of {n + len(r.query)} tokens exceeds the model context"
    return bad, InputTooLarge, pattern


FAULTS = [
    no_tokens,
    item_id_outside_vocab,
    query_id_outside_vocab,
    label_outside_vocab,
    no_labels,
    not_an_id,
    text_and_ids,
    too_many_items,
    too_many_labels,
    over_the_context,
]


@st.composite
def invalid_request(draw, fault):
    """A token-id request with `fault`: (request, exception type, message pattern)."""
    items = draw(st.lists(id_lists(1, 30), min_size=1, max_size=6))
    return fault(draw, Request(draw(id_lists(0, 40)), items, draw(LABELS)))


@PROPERTY
@given(bad=st.tuples(*map(invalid_request, FAULTS)), good=valid_request())
def _invalid_raise_naming_the_field(engine, reference, bad, good):
    """Every fault at once, beside a valid request."""
    *failed, scored = submit(engine, [r for r, _, _ in bad] + [good])
    for (r, kind, pattern), got in zip(bad, failed, strict=True):
        assert isinstance(got, outcome.Error), r
        assert type(got.error) is kind and re.search(pattern, str(got.error)), (r, got.error)
        assert str(got.error).startswith(f"{got.error.field}: "), got.error  # the field, typed
    assert_scores(scored.unwrap().scores, good.reference(reference))


def test_invalid_requests_raise_naming_the_field(tiny_path):
    run_in_engine(_invalid_raise_naming_the_field, tiny_path)
