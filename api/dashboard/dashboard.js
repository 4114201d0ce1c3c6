"use strict";
// The live dashboard. It polls `metrics` (relative: under a proxy's path prefix too) and shows
// each figure now (from counter deltas over the last WINDOW_S seconds of polls) and since the
// server started, and charts the last HISTORY_S seconds. Every figure is computed from what
// /metrics says and nothing else; `window.dashboard` holds the functions that do it.
(() => {
  const POLL_MS = 1000;
  const WINDOW_S = 10;
  const HISTORY_S = 300;
  const KEY = sessionStorage.getItem("scoring-api-key"); // put there by the key form
  // the dashboard's own polls and health checks are not counted as requests
  const MONITORING = new Set(["/metrics", "/dashboard", "/health", "/ping"]);
  const STAGES = ["tokenize", "queue", "batch_build", "device", "total"];
  const QUANTILES = [["p50", 0.5], ["p90", 0.9], ["p99", 0.99]];
  const COLORS = ["#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed"];

  const number = (s) => (s === "+Inf" ? Infinity : s === "-Inf" ? -Infinity : Number(s));
  const unescape = (v) => v.replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));

  /** Prometheus text as {name: [{labels, value}]}. */
  function parse(text) {
    const metrics = {};
    for (const line of text.split("\n")) {
      const m = /^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
      if (m === null) continue; // a comment or a blank line
      const labels = {};
      for (const [, k, v] of (m[2] ?? "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) {
        labels[k] = unescape(v);
      }
      (metrics[m[1]] ??= []).push({ labels, value: number(m[3]) });
    }
    return metrics;
  }

  /** The sum of the samples of `name` whose labels `keep` accepts. */
  function total(metrics, name, keep = () => true) {
    const samples = (metrics[name] ?? []).filter((s) => keep(s.labels));
    return samples.reduce((sum, s) => sum + s.value, 0);
  }

  /** The counters of one scrape, as the dashboard adds them up. */
  function counters(metrics) {
    const request = (l) => !MONITORING.has(l.route);
    const by = (key, value) => (l) => l[key] === value;
    const stage = (name) =>
      Object.fromEntries(STAGES.map((s) => [s, total(metrics, name, by("stage", s))]));
    const latency = metrics.scoring_stage_seconds_bucket ?? [];
    return {
      requests: total(metrics, "scoring_http_requests_total", request),
      errors: total(metrics, "scoring_http_requests_total", (l) => request(l) && Number(l.status) >= 400),
      items: total(metrics, "scoring_items_total"),
      busy: total(metrics, "scoring_device_busy_seconds_total"),
      hit: total(metrics, "scoring_prefix_cache_tokens_total", by("result", "hit")),
      miss: total(metrics, "scoring_prefix_cache_tokens_total", by("result", "miss")),
      real: total(metrics, "scoring_batch_tokens_total", by("kind", "real")),
      padded: total(metrics, "scoring_batch_tokens_total", by("kind", "padded")),
      stageSum: stage("scoring_stage_seconds_sum"),
      stageCount: stage("scoring_stage_seconds_count"),
      buckets: Object.fromEntries(
        latency.filter((s) => s.labels.stage === "total").map((s) => [s.labels.le, s.value]),
      ),
    };
  }

  /** The gauges of one scrape. */
  const gauges = (metrics) => ({
    queue: total(metrics, "scoring_queue_depth"),
    inFlight: total(metrics, "scoring_requests_in_flight"),
  });

  /** Counters `b` less `a`, field by field; one that went down counts from 0 (a restart). */
  function since(a, b) {
    if (typeof b === "number") return b >= a ? b - a : b;
    return Object.fromEntries(Object.entries(b).map(([k, v]) => [k, since(a?.[k] ?? 0, v)]));
  }

  /** Prometheus' histogram_quantile over cumulative `buckets` ({le: count}): linear inside
   * the bucket holding rank q * count, the highest finite bound when that is the +Inf bucket;
   * null without observations. */
  function quantile(q, buckets) {
    const sorted = Object.entries(buckets)
      .map(([le, n]) => [number(le), n])
      .sort((x, y) => x[0] - y[0]);
    const count = sorted.length ? sorted[sorted.length - 1][1] : 0;
    if (count === 0) return null;
    const rank = q * count;
    let [lower, below] = [0, 0];
    for (const [le, n] of sorted) {
      if (n >= rank) {
        return le === Infinity ? lower : lower + (le - lower) * ((rank - below) / (n - below));
      }
      [lower, below] = [le, n];
    }
    return lower;
  }

  const ratio = (part, rest) => (part + rest > 0 ? part / (part + rest) : null);
  const per = (a, b) => (b > 0 ? a / b : null);

  /** The figures of counts `d` (a difference of two scrapes, or one scrape: since start), its
   * rates over `dt` seconds. */
  function figures(d, dt) {
    return {
      items: d.items / dt,
      requests: d.requests / dt,
      busy: d.busy / dt,
      hit: ratio(d.hit, d.miss),
      padding: ratio(d.real, d.padded),
      quantiles: QUANTILES.map(([, q]) => quantile(q, d.buckets)),
      stages: Object.fromEntries(STAGES.map((s) => [s, per(d.stageSum[s], d.stageCount[s])])),
    };
  }

  // -- the page ---------------------------------------------------------------------------

  const three = new Intl.NumberFormat("en", { maximumSignificantDigits: 3 });
  const grouped = new Intl.NumberFormat("en");
  const count = (n) => grouped.format(n);
  const rate = (n) => three.format(n);
  const ms = (s) => `${three.format(s * 1000)} ms`;
  const percent = (f) => `${(f * 100).toFixed(1)} %`;
  const seconds = (s) => `${three.format(s)} s`;
  const times = (k) => (v) => (v === null || v === undefined ? null : v * k);
  const [milli, hundred] = [times(1000), times(100)];

  /** Shows `value` in element `id` (its raw number in `data-value`; none: a dash). */
  function show(id, value, format) {
    const element = document.getElementById(id);
    element.dataset.value = value === null ? "" : String(value);
    element.textContent = value === null ? "–" : format(value);
  }

  const CHARTS = [
    ["throughput", "per second", null, [
      ["items/s", (p) => p.now?.items],
      ["requests/s", (p) => p.now?.requests],
    ]],
    ["latency", "latency, ms", null, QUANTILES.map(([name], i) => [
      name, (p) => milli(p.now?.quantiles[i]),
    ])],
    ["queue", "requests", null, [
      ["queue depth", (p) => p.gauges.queue],
      ["in flight", (p) => p.gauges.inFlight],
    ]],
    ["efficiency", "%", 100, [
      ["device busy", (p) => hundred(p.now?.busy)],
      ["prefix cache hits", (p) => hundred(p.now?.hit)],
      ["padding efficiency", (p) => hundred(p.now?.padding)],
    ]],
    ["stages", "ms per request", null, STAGES.slice(0, -1).map((s) => [
      s, (p) => milli(p.now?.stages[s]),
    ])],
  ];

  const scrapes = []; // {t, counts}: the window's, oldest first
  const points = []; // {t, now, gauges}: the charts' history, oldest first
  let polls = 0;

  function update(metrics, t) {
    const counts = counters(metrics);
    scrapes.push({ t, counts });
    while (scrapes.length > 2 && t - scrapes[1].t >= WINDOW_S) scrapes.shift();
    const base = scrapes[0];
    const now = base.t < t ? figures(since(base.counts, counts), t - base.t) : null;
    points.push({ t, now, gauges: gauges(metrics) });
    while (t - points[0].t > HISTORY_S) points.shift();
    render(now, figures(counts, NaN), counts, points[points.length - 1].gauges);
    for (const [id, , top, series] of CHARTS) {
      plot(document.getElementById(`chart-${id}`), series, top);
    }
    polls += 1;
    document.body.dataset.polls = polls;
    const time = new Date().toLocaleTimeString("en-GB");
    status(`now: the last ${WINDOW_S} s; charts: up to ${HISTORY_S / 60} min; at ${time}`);
  }

  function render(now, start, counts, g) {
    const at = (f) => (now === null ? null : f(now));
    show("items-rate", at((f) => f.items), rate);
    show("items-total", counts.items, count);
    show("requests-rate", at((f) => f.requests), rate);
    show("requests-total", counts.requests, count);
    show("errors-total", counts.errors, count);
    QUANTILES.forEach(([name], i) => {
      show(name, at((f) => f.quantiles[i]), ms);
      show(`${name}-total`, start.quantiles[i], ms);
    });
    show("queue-depth", g.queue, count);
    show("in-flight", g.inFlight, count);
    show("busy", at((f) => f.busy), percent);
    show("busy-total", counts.busy, seconds);
    show("hit", at((f) => f.hit), percent);
    show("hit-total", start.hit, percent);
    show("padding", at((f) => f.padding), percent);
    show("padding-total", start.padding, percent);
    for (const s of STAGES) {
      show(`stage-${s}`, at((f) => f.stages[s]), ms);
      show(`stage-${s}-total`, start.stages[s], ms);
      show(`stage-${s}-share`, per(counts.stageSum[s], counts.stageSum.total), percent);
    }
  }

  /** Draws `series` ([name, value of a point]) over the history; the y axis runs to `top`,
   * or to a round number above the highest value. */
  function plot(canvas, series, top) {
    const scale = window.devicePixelRatio || 1;
    const [w, h] = [canvas.clientWidth, canvas.clientHeight];
    [canvas.width, canvas.height] = [Math.round(w * scale), Math.round(h * scale)];
    const g = canvas.getContext("2d");
    g.scale(scale, scale);
    const values = series.flatMap(([, f]) => points.map(f)).filter(Number.isFinite);
    top ??= round(Math.max(0, ...values));
    const end = points[points.length - 1].t;
    const span = Math.max(WINDOW_S, end - points[0].t);
    const [left, right, upper, lower] = [44, w - 8, 6, h - 18];
    const x = (t) => left + ((t - end + span) / span) * (right - left);
    const y = (v) => lower - (v / top) * (lower - upper);
    g.font = "11px system-ui, sans-serif";
    g.lineWidth = 1;
    for (const f of [0, 0.5, 1]) {
      g.strokeStyle = "#dde1e8";
      g.beginPath();
      g.moveTo(left, y(top * f));
      g.lineTo(right, y(top * f));
      g.stroke();
      g.fillStyle = "#6b7385";
      g.fillText(three.format(top * f), 2, y(top * f) + 4);
    }
    g.fillText(span < 120 ? `${Math.round(span)} s ago` : `${Math.round(span / 60)} min ago`, left, h - 3);
    g.textAlign = "right";
    g.fillText("now", right, h - 3);
    g.lineWidth = 2;
    series.forEach(([, f], i) => {
      g.strokeStyle = COLORS[i];
      g.beginPath();
      let drawing = false;
      for (const p of points) {
        const v = f(p);
        if (Number.isFinite(v)) (drawing ? g.lineTo : g.moveTo).call(g, x(p.t), y(v));
        drawing = Number.isFinite(v);
      }
      g.stroke();
    });
  }

  /** The smallest 1, 2 or 5 times a power of ten at or above `v` (1 for nothing). */
  function round(v) {
    if (!(v > 0)) return 1;
    const power = 10 ** Math.floor(Math.log10(v));
    return [1, 2, 5, 10].map((m) => m * power).find((r) => r >= v);
  }

  function status(text, bad = false) {
    const element = document.getElementById("status");
    element.textContent = text;
    element.classList.toggle("bad", bad);
  }

  async function poll() {
    const headers = KEY === null ? {} : { Authorization: `Bearer ${KEY}` };
    try {
      const answer = await fetch("metrics", { headers, cache: "no-store" });
      if (answer.status === 401) {
        sessionStorage.removeItem("scoring-api-key");
        status("the API key was refused: reload the page to enter it again", true);
        return;
      }
      if (!answer.ok) throw new Error(`metrics answered ${answer.status}`);
      update(parse(await answer.text()), performance.now() / 1000);
    } catch (error) {
      status(`no figures: ${error.message}`, true);
    }
    setTimeout(poll, POLL_MS);
  }

  function build() {
    for (const [id, title, , series] of CHARTS) {
      const legend = document.getElementById(`legend-${id}`);
      const heading = document.createElement("h2");
      heading.textContent = title;
      legend.append(heading);
      series.forEach(([name], i) => {
        const swatch = document.createElement("span");
        swatch.textContent = name;
        swatch.style.setProperty("--swatch", COLORS[i]);
        legend.append(swatch);
      });
    }
    const rows = document.getElementById("stages");
    for (const s of STAGES) {
      const row = rows.insertRow();
      row.insertCell().textContent = s;
      for (const suffix of ["", "-total", "-share"]) {
        const cell = row.insertCell().appendChild(document.createElement("output"));
        cell.id = `stage-${s}${suffix}`;
      }
    }
  }

  window.dashboard = { parse, counters, gauges, since, figures, quantile };
  build();
  poll();
})();
