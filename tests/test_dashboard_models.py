"""`/dashboard` of a server of two models (the tiny decoder and a tiny embedder), in Debian's
headless `chromium`: one section per model, in the order served, each showing that model's own
figures, equal to what `/metrics` says of it (`scoring_model_requests_total` and the engine
counters labelled with its `model`) as requests go to one model, then the other; the window
figures of each; the charts of each model draw."""

import httpx2
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.test_api_support import BASE_ENV, NO, YES, hypercorn_server, ids
from tests.test_dashboard import chromium, ratio, watched_page
from tests.test_embed import tiny_embedder

MODELS = ("scorer", "embedder")  # as served: the models file's order
TEXTS = ["a kitten sleeps on the mat", "stocks fell sharply"]
RNG = np.random.default_rng(77)
# to the scorer; its long query's prefix is kept in the KV pool
SCORE = {"query": ids(RNG, 64), "items": [ids(RNG, 4) for _ in TEXTS], "label_token_ids": [YES, NO]}
EMBED = {"model": "embedder", "input": TEXTS}

# what model `model`'s section shows (`data-value` of each figure), by figure
READ = """([model, figures]) => {
    const section = document.querySelector(`[data-model="${model}"]`);
    const value = (f) => section.querySelector(`[data-figure="${f}"]`).dataset.value;
    return Object.fromEntries(figures.map((f) => [f, value(f)]));
}"""
# each model's figures of what changed from one scrape to another, 2 s later, by the page's code
WINDOW = """([a, b, models]) => {
    const d = window.dashboard, [x, y] = [a, b].map(d.parse);
    const change = (m) => d.since(d.modelCounters(x, m), d.modelCounters(y, m));
    return Object.fromEntries(models.map((m) => [m, d.modelFigures(change(m), 2)]));
}"""
# how many of a model's chart's pixels are coloured (a series line; the grid is grey)
COLOURED = """([model, chart]) => {
    const c = document.querySelector(`[data-model="${model}"] [data-chart="${chart}"]`);
    const data = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < data.length; i += 4) {
        const [r, g, b, a] = data.slice(i, i + 4);
        if (a > 128 && Math.max(r, g, b) - Math.min(r, g, b) > 80) n += 1;
    }
    return n;
}"""


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:
        yield browser


@pytest.fixture
def page(browser):
    with watched_page(browser) as page:
        yield page


@pytest.fixture
def server(tiny_checkpoints, tmp_path):
    """A fresh server of the two models: every count starts at zero."""
    models = tmp_path / "models.toml"
    models.write_text(
        f'[[models]]\nname = "scorer"\nmodel = "{tiny_checkpoints["llama-untied"]}"\n\n'
        f'[[models]]\nname = "embedder"\nmodel = "{tiny_embedder(tmp_path, "bert-mean")}"\n'
    )
    env = {**BASE_ENV, "SCORING_MODELS": str(models)}
    with hypercorn_server("asyncio", env, tmp_path / "hypercorn.log") as server:
        yield server


def test_each_model_has_its_section_with_its_own_figures(page, server, tmp_path):
    page.goto(f"{server.url}/dashboard")
    page.wait_for_function("() => document.body.dataset.polls >= 1")
    # every engine is ready once /health is: both models from the first poll, in served order
    order = "() => [...document.querySelectorAll('[data-model]')].map(s => s.dataset.model)"
    assert page.evaluate(order) == list(MODELS)
    assert page.locator("[data-model] .name").all_text_contents() == list(MODELS)
    assert page.is_visible("#scope")
    wait_shown(page, server, {"scorer": 0, "embedder": 0})

    post(server, "/v1/score", SCORE)  # no model named: the one that scores
    shown = wait_shown(page, server, {"scorer": 1, "embedder": 0})
    assert shown["scorer"]["tokens-total"] > 0 and shown["scorer"]["batches-total"] >= 1
    assert shown["embedder"]["tokens-total"] == shown["embedder"]["batches-total"] == 0
    assert shown["scorer"]["kv-pages"] > 0 and shown["scorer"]["kv-used"] > 0  # its prefix kept

    post(server, "/v1/embeddings", EMBED)
    shown = wait_shown(page, server, {"scorer": 1, "embedder": 1})
    assert shown["embedder"]["tokens-total"] > 0 and shown["embedder"]["batches-total"] >= 1

    post(server, "/v1/embeddings", EMBED | {"model": "scorer"}, expect=400)  # cannot embed
    shown = wait_shown(page, server, {"scorer": 2, "embedder": 1})
    assert shown["scorer"]["errors-total"] == 1 and shown["embedder"]["errors-total"] == 0

    polls = page.evaluate("() => Number(document.body.dataset.polls)")
    page.wait_for_function("n => document.body.dataset.polls >= n + 2", arg=polls)
    for model in MODELS:
        for chart in ("throughput", "efficiency"):
            assert page.evaluate(COLOURED, [model, chart]) > 50, (model, chart)
    page.screenshot(path=tmp_path / "dashboard-models.png", full_page=True)
    # the figures of a window: the page's functions on two scrapes, 2 s apart
    before = metrics(server)
    post(server, "/v1/score", SCORE)
    post(server, "/v1/embeddings", EMBED)
    post(server, "/v1/embeddings", EMBED)
    after = metrics(server)
    got = page.evaluate(WINDOW, [before, after, list(MODELS)])
    for m in MODELS:
        assert got[m] == pytest.approx(window(counts(before, m), counts(after, m), 2.0)), m
    assert (got["scorer"]["requests"], got["embedder"]["requests"]) == (0.5, 1.0)


def test_metrics_carry_each_models_requests_by_status(server):
    post(server, "/v1/score", SCORE)
    post(server, "/v1/embeddings", EMBED | {"model": "scorer"}, expect=400)
    post(server, "/embed", {"inputs": TEXTS})  # TEI's: to the model that embeds
    samples = [s for f in text_string_to_metric_families(metrics(server)) for s in f.samples]
    requests = {
        (s.labels["model"], s.labels["status"]): s.value
        for s in samples
        if s.name == "scoring_model_requests_total"
    }
    assert requests == {("scorer", "200"): 1, ("scorer", "400"): 1, ("embedder", "200"): 1}
    queues = [s.labels["model"] for s in samples if s.name == "scoring_queue_depth"]
    assert queues == list(MODELS)  # each engine's counters under its name, in served order


def post(server, path: str, body: dict, expect: int = 200) -> dict:
    r = httpx2.post(f"{server.url}{path}", json=body, timeout=120)
    assert r.status_code == expect, r.text
    return r.json()


def metrics(server) -> str:
    return httpx2.get(f"{server.url}/metrics", timeout=60).text


def wait_shown(page, server, requests: dict[str, int]) -> dict[str, dict]:
    """Once the server has counted `requests` (model -> requests asked of it) and the page
    shows them: what each model's section shows, asserted equal to what /metrics says of it
    (the server is idle, so its counters stand still)."""
    text = metrics(server)
    assert {m: counts(text, m)["requests"] for m in MODELS} == requests
    want = {m: shown_figures(text, m) for m in MODELS}
    page.wait_for_function(
        """(want) => Object.entries(want).every(([model, figures]) => {
            const section = document.querySelector(`[data-model="${model}"]`);
            const value = (f) => section.querySelector(`[data-figure="${f}"]`).dataset.value;
            return ["requests-total", "tokens-total"].every((f) => value(f) == figures[f]);
        })""",
        arg=want,
    )
    shown = {m: page.evaluate(READ, [m, list(want[m])]) for m in MODELS}
    shown = {m: {k: float(v) if v else None for k, v in f.items()} for m, f in shown.items()}
    for m in MODELS:
        assert shown[m] == pytest.approx(want[m]), m
    return shown


# -- one model's figures from /metrics, as docs/dashboard.md defines them (the page's oracle) --


def counts(text: str, model: str) -> dict[str, float]:
    """The counters and gauges of `model` in the scrape `text`."""
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]

    def total(name: str, **labels: str) -> float:
        keep = lambda s: s.name == name and (labels | {"model": model}).items() <= s.labels.items()
        return sum(s.value for s in samples if keep(s))

    asked = lambda s: s.name == "scoring_model_requests_total" and s.labels["model"] == model
    requests = [s for s in samples if asked(s)]
    return {
        "requests": sum(s.value for s in requests),
        "errors": sum(s.value for s in requests if int(s.labels["status"]) >= 400),
        "batches": total("scoring_batches_total"),
        "busy": total("scoring_device_busy_seconds_total"),
        "hit": total("scoring_prefix_cache_tokens_total", result="hit"),
        "miss": total("scoring_prefix_cache_tokens_total", result="miss"),
        "real": total("scoring_batch_tokens_total", kind="real"),
        "padded": total("scoring_batch_tokens_total", kind="padded"),
        "evicted": total("scoring_kv_pages_evicted_total"),
        "compiles": total("scoring_compiles_total"),
        "tokenizer_hit": total("scoring_tokenizer_cache_total", result="hit"),
        "tokenizer_miss": total("scoring_tokenizer_cache_total", result="miss"),
        "queue": total("scoring_queue_depth"),
        "in_flight": total("scoring_requests_in_flight"),
        "queued_tokens": total("scoring_queued_tokens"),
        "kv_used": total("scoring_kv_pages", state="used"),
        "kv_free": total("scoring_kv_pages", state="free"),
    }


def shown_figures(text: str, model: str) -> dict[str, float | None]:
    """Since start: what `model`'s section shows, by figure."""
    c = counts(text, model)
    return {
        "requests-total": c["requests"],
        "errors-total": c["errors"],
        "tokens-total": c["real"],
        "batches-total": c["batches"],
        "queue-depth": c["queue"],
        "in-flight": c["in_flight"],
        "queued-tokens": c["queued_tokens"],
        "busy-total": c["busy"],
        "hit-total": ratio(c["hit"], c["miss"]),
        "padding-total": ratio(c["real"], c["padded"]),
        "kv-used": ratio(c["kv_used"], c["kv_free"]),
        "kv-pages": c["kv_used"] + c["kv_free"],
        "evicted-total": c["evicted"],
        "tokenizer-total": ratio(c["tokenizer_hit"], c["tokenizer_miss"]),
        "compiles-total": c["compiles"],
    }


def window(a: dict, b: dict, dt: float) -> dict[str, float | None]:
    """The page's `modelFigures` of what changed from counts `a` to counts `b`, `dt` s apart."""
    d = {k: b[k] - a[k] for k in a}
    return {
        "requests": d["requests"] / dt,
        "tokens": d["real"] / dt,
        "batches": d["batches"] / dt,
        "busy": d["busy"] / dt,
        "hit": ratio(d["hit"], d["miss"]),
        "padding": ratio(d["real"], d["padded"]),
        "tokenizer": ratio(d["tokenizer_hit"], d["tokenizer_miss"]),
    }
