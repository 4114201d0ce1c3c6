"""`/dashboard` in a real headless Chromium (Debian's `chromium`, driven by playwright), against
a hypercorn server on the tiny model that requires an API key and sits behind a proxy's path
prefix (`--root-path /prefix`; the browser loads `/prefix/dashboard`). The key form, the figures
against what `/metrics` says under a bounded load, the charts, a screenshot."""

import concurrent.futures
import contextlib
import shutil
import threading
from collections.abc import Iterator

import anyio
import httpx2
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.test_api_support import NO, YES, hypercorn_server, ids, tiny_env, wait_until

KEY = "dashboard-test-key-3141"
AUTH = {"Authorization": f"Bearer {KEY}"}
PREFIX = "/prefix"
LOAD, ITEMS, CONCURRENCY = 300, 3, 8
MONITORING = {"/metrics", "/dashboard", "/health", "/ping"}  # not requests, to the dashboard
STAGES = ("tokenize", "queue", "batch_build", "device", "total")
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
CHARTS = ("throughput", "latency", "queue", "efficiency", "stages")
WAIT_MS = 120_000  # two shared cores: room for a slow poll

# the figures as the page shows them (`data-value` of each element)
READ = "ids => Object.fromEntries(ids.map(id => [id, document.getElementById(id).dataset.value]))"
# how many of a canvas's pixels are coloured (a series line; the grid and labels are grey)
COLOURED = """id => {
    const c = document.getElementById(id);
    const data = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < data.length; i += 4) {
        const [r, g, b, a] = data.slice(i, i + 4);
        if (a > 128 && Math.max(r, g, b) - Math.min(r, g, b) > 80) n += 1;
    }
    return n;
}"""


@contextlib.contextmanager
def chromium() -> Iterator:
    """Debian's headless `chromium`, driven by playwright."""
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("`chromium` is not installed: these tests drive it (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[test]'")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable)
        yield browser
        browser.close()


@contextlib.contextmanager
def watched_page(browser) -> Iterator:
    """A page in a fresh context (no key kept), which records what it asks for and its
    script errors, and has none once done."""
    context = browser.new_context(viewport={"width": 1400, "height": 640})
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    page.requested, page.errors = [], []
    page.on("request", lambda r: page.requested.append(r.url))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: "Security Policy" in m.text and page.errors.append(m.text))
    yield page
    context.close()
    assert page.errors == []


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def server(tiny_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("dashboard") / "hypercorn.log"
    env = tiny_env(tiny_path, SCORING_API_KEY=KEY)
    with hypercorn_server("asyncio", env, log, "--root-path", PREFIX) as server:
        yield server


@pytest.fixture
def page(browser):
    with watched_page(browser) as page:
        yield page


def open_dashboard(page, server):
    """Load the dashboard through the key form; returns once it has shown figures."""
    page.goto(f"{server.url}{PREFIX}/dashboard")
    page.fill("#key", KEY)
    page.click("button")
    page.wait_for_function("() => document.body.dataset.polls >= 1")


def test_the_page_needs_the_key(server):
    with httpx2.Client(base_url=f"{server.url}{PREFIX}", timeout=60) as client:
        r = client.get("/dashboard")
        assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
        r = client.get("/dashboard", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        # a browser is asked for the key, and shown nothing else
        r = client.get("/dashboard", headers={"Accept": "text/html"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert 'id="key"' in r.text and "items-rate" not in r.text
        r = client.get("/dashboard", headers=AUTH)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert 'id="items-rate"' in r.text and KEY not in r.text
        assert "src=" not in r.text and "href=" not in r.text.replace('href="data:,"', "")
        assert r.headers["cache-control"] == "no-store"
        assert "script-src 'sha256-" in r.headers["content-security-policy"]
    # a proxy that strips the prefix: the same page
    assert httpx2.get(f"{server.url}/dashboard", headers=AUTH, timeout=60).text == r.text


def test_the_key_form_opens_the_dashboard_and_a_reload_keeps_it(page, server):
    answer = page.goto(f"{server.url}{PREFIX}/dashboard")
    assert answer.status == 401
    page.fill("#key", "not the key")
    page.click("button")
    page.wait_for_function("() => document.getElementById('message').textContent === 'wrong key'")
    page.fill("#key", KEY)
    page.click("button")
    page.wait_for_function("() => document.body.dataset.polls >= 2")
    assert page.title() == "Scoring engine"
    # one model: the server's figures are its own, and no section per model
    assert page.locator("[data-model]").count() == 0 and page.is_hidden("#scope")
    page.reload()  # the navigation carries no key: the form answers, with the tab's key
    page.wait_for_function("() => document.body.dataset.polls >= 1")
    # relative URLs only: all under the prefix; and the key in none, nor in the server's log
    assert page.requested and all(u.startswith(f"{server.url}{PREFIX}/") for u in page.requested)
    assert not any(KEY in u for u in page.requested)
    assert KEY not in server.log.read_text()


def test_figures_equal_metrics_under_load_and_charts_draw(page, server, tmp_path):
    open_dashboard(page, server)
    before = metrics(server)
    seen = threading.Event()  # the load goes on until the page has shown a rate
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        load = pool.submit(anyio.run, score_load, f"{server.url}{PREFIX}", seen)
        try:
            # live: rates from the polls that saw the load
            page.wait_for_function("() => document.getElementById('items-rate').dataset.value > 0")
        finally:
            seen.set()
        statuses = load.result()
    sent = len(statuses)
    assert statuses == [200] * sent and sent >= LOAD
    # a request is counted once its answer has gone out: wait for the last one's count
    done = figures(before)["requests-total"] + sent
    assert wait_until(lambda: figures(metrics(server))["requests-total"] == done)
    after = metrics(server)
    want = figures(after)
    assert want["items-total"] == figures(before)["items-total"] + sent * ITEMS
    assert want["queue-depth"] == want["in-flight"] == want["errors-total"] == 0
    assert want["hit-total"] > 0 and want["padding-total"] > 0
    # the load is over: the counters stand still, and the page shows them once it polls again
    page.wait_for_function(
        "([r, i]) => document.getElementById('requests-total').dataset.value == r"
        " && document.getElementById('items-total').dataset.value == i",
        arg=[want["requests-total"], want["items-total"]],
    )
    shown = {k: float(v) if v else None for k, v in page.evaluate(READ, list(want)).items()}
    assert shown == pytest.approx(want, rel=1e-12)
    for chart in CHARTS:
        assert page.evaluate(COLOURED, f"chart-{chart}") > 50, chart
    page.screenshot(path=tmp_path / "dashboard.png", full_page=True)
    assert (tmp_path / "dashboard.png").stat().st_size > 20_000
    # the figures of a window: the page's functions on the two scrapes, 2 s apart
    got = page.evaluate(
        """([a, b]) => {
            const d = window.dashboard, [x, y] = [a, b].map(t => d.counters(d.parse(t)));
            return d.figures(d.since(x, y), 2);
        }""",
        [before, after],
    )
    assert flat(got) == pytest.approx(window(before, after, 2.0), rel=1e-12)


async def score_load(url: str, seen: threading.Event) -> list[int]:
    """LOAD small `/v1/score` requests, CONCURRENCY at a time, on one long query (its prefix
    is read from the KV cache after the first), and then more of them until `seen` is set:
    their statuses."""
    rng = np.random.default_rng(18)
    query = ids(rng, 64)
    bodies = [
        {"query": query, "items": [ids(rng, 4) for _ in range(ITEMS)], "label_token_ids": [YES, NO]}
        for _ in range(LOAD)
    ]
    statuses = []
    async with httpx2.AsyncClient(base_url=url, headers=AUTH, timeout=120) as client:

        async def send(share: list[dict]) -> None:
            for body in share:
                statuses.append((await client.post("/v1/score", json=body)).status_code)
            with anyio.fail_after(WAIT_MS / 1000):
                while not seen.is_set():
                    statuses.append((await client.post("/v1/score", json=share[0])).status_code)

        async with anyio.create_task_group() as tasks:
            for i in range(CONCURRENCY):
                tasks.start_soon(send, bodies[i::CONCURRENCY])
    return statuses


def metrics(server) -> str:
    return httpx2.get(f"{server.url}{PREFIX}/metrics", headers=AUTH, timeout=60).text


# -- the figures from /metrics, as docs/dashboard.md defines them (the page's oracle) ---------


def counts(text: str) -> dict:
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]

    def total(name: str, **labels: str) -> float:
        keep = lambda s: s.name == name and labels.items() <= s.labels.items()
        return sum(s.value for s in samples if keep(s))

    requests = [s for s in samples if s.name == "scoring_http_requests_total"]
    requests = [s for s in requests if s.labels["route"] not in MONITORING]
    return {
        "requests": sum(s.value for s in requests),
        "errors": sum(s.value for s in requests if int(s.labels["status"]) >= 400),
        "items": total("scoring_items_total"),
        "busy": total("scoring_device_busy_seconds_total"),
        "hit": total("scoring_prefix_cache_tokens_total", result="hit"),
        "miss": total("scoring_prefix_cache_tokens_total", result="miss"),
        "real": total("scoring_batch_tokens_total", kind="real"),
        "padded": total("scoring_batch_tokens_total", kind="padded"),
        "queue": total("scoring_queue_depth"),
        "in_flight": total("scoring_requests_in_flight"),
        "sum": {st: total("scoring_stage_seconds_sum", stage=st) for st in STAGES},
        "count": {st: total("scoring_stage_seconds_count", stage=st) for st in STAGES},
        "buckets": {
            float(s.labels["le"]): s.value
            for s in samples
            if s.name == "scoring_stage_seconds_bucket" and s.labels["stage"] == "total"
        },
    }


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile of cumulative buckets ({bound: count})."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] == 0:
        return None
    rank, (lower, below) = q * ordered[-1][1], (0.0, 0.0)
    for bound, n in ordered:
        if n >= rank:
            break
        lower, below = bound, n
    if bound == float("inf"):
        return lower
    return lower + (bound - lower) * ((rank - below) / (n - below))


def ratio(part: float, rest: float) -> float | None:
    return part / (part + rest) if part + rest > 0 else None


def per(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def figures(text: str) -> dict:
    """Since start: what the page shows by element id."""
    c = counts(text)
    shown = {
        "requests-total": c["requests"],
        "errors-total": c["errors"],
        "items-total": c["items"],
        "queue-depth": c["queue"],
        "in-flight": c["in_flight"],
        "busy-total": c["busy"],
        "hit-total": ratio(c["hit"], c["miss"]),
        "padding-total": ratio(c["real"], c["padded"]),
    }
    shown |= {f"{name}-total": quantile(q, c["buckets"]) for name, q in QUANTILES.items()}
    for st in STAGES:
        shown[f"stage-{st}-total"] = per(c["sum"][st], c["count"][st])
        shown[f"stage-{st}-share"] = per(c["sum"][st], c["sum"]["total"])
    return shown


def window(a: str, b: str, dt: float) -> dict:
    """The page's `figures` of what changed from scrape `a` to scrape `b`, `dt` seconds apart."""
    x, y = counts(a), counts(b)
    d = {k: y[k] - x[k] for k in ("requests", "items", "busy", "hit", "miss", "real", "padded")}
    buckets = {le: n - x["buckets"].get(le, 0) for le, n in y["buckets"].items()}
    return flat(
        {
            "items": d["items"] / dt,
            "requests": d["requests"] / dt,
            "busy": d["busy"] / dt,
            "hit": ratio(d["hit"], d["miss"]),
            "padding": ratio(d["real"], d["padded"]),
            "quantiles": [quantile(q, buckets) for q in QUANTILES.values()],
            "stages": {
                st: per(y["sum"][st] - x["sum"][st], y["count"][st] - x["count"][st])
                for st in STAGES
            },
        }
    )


def flat(figures: dict) -> dict:
    """`figures` with its lists and dicts spread out: {"stages.queue": ...}."""
    out = {}
    for k, v in figures.items():
        inner = enumerate(v) if isinstance(v, list) else v.items() if isinstance(v, dict) else ()
        out |= {f"{k}.{i}": x for i, x in inner} if inner else {k: v}
    return out
