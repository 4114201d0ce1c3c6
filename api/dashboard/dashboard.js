"use strict";
// The live dashboard. It polls `metrics` (relative: under a proxy's path prefix too) and shows
// each figure now (from counter deltas over the last WINDOW_S seconds of polls) and since the
// server started, and charts the last HISTORY_S seconds: the server's, and where it serves
// several models each model's. Every figure is computed from what /metrics says and nothing
// else, by the functions of `window.dashboard` (figures.js).
(() => {
  const POLL_MS = 1000;
  const WINDOW_S = 10;
  const HISTORY_S = 300;
  const KEY = sessionStorage.getItem("scoring-api-key"); // put there by the key form
  const COLORS = ["#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed"];
  const {
    STAGES, QUANTILES, parse, counters, gauges, models, modelCounters, modelGauges, since,
    ratio, per, figures, modelFigures,
  } = window.dashboard;

  const three = new Intl.NumberFormat("en", { maximumSignificantDigits: 3 });
  const grouped = new Intl.NumberFormat("en");
  const count = (n) => grouped.format(n);
  const rate = (n) => three.format(n);
  const ms = (s) => `${three.format(s * 1000)} ms`;
  const percent = (f) => `${(f * 100).toFixed(1)} %`;
  const seconds = (s) => `${three.format(s)} s`;
  const times = (k) => (v) => (v === null || v === undefined ? null : v * k);
  const [milli, hundred] = [times(1000), times(100)];

  /** Shows `value` in `element` (its raw number in `data-value`; none: a dash). */
  function put(element, value, format) {
    element.dataset.value = value === null ? "" : String(value);
    element.textContent = value === null ? "–" : format(value);
  }

  /** Shows `value` in the element `id`. */
  const show = (id, value, format) => put(document.getElementById(id), value, format);

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

  // each model's charts: [id, title, top, [name, value of the model's part of a point]]
  const MODEL_CHARTS = [
    ["throughput", "per second", null, [
      ["requests/s", (p) => p.now?.requests],
      ["batches/s", (p) => p.now?.batches],
    ]],
    ["efficiency", "%", 100, [
      ["device busy", (p) => hundred(p.now?.busy)],
      ["prefix cache hits", (p) => hundred(p.now?.hit)],
      ["padding efficiency", (p) => hundred(p.now?.padding)],
      ["KV pool used", (p) => hundred(p.kv)],
    ]],
  ];

  const scrapes = []; // {t, counts, each (model -> counts)}: the window's, oldest first
  const points = []; // {t, now, gauges, models (model -> {now, gauges, kv})}: the charts' history
  const sections = new Map(); // model -> its section of the page, once several are served
  let polls = 0;

  function update(metrics, t) {
    const counts = counters(metrics);
    const names = models(metrics);
    const each = Object.fromEntries(names.map((m) => [m, modelCounters(metrics, m)]));
    scrapes.push({ t, counts, each });
    while (scrapes.length > 2 && t - scrapes[1].t >= WINDOW_S) scrapes.shift();
    const base = scrapes[0];
    const over = (f, a, b) => (base.t < t ? f(since(a, b), t - base.t) : null); // the window's
    const shown = names.length > 1 ? names : []; // one model: the server's figures are its own
    const now = over(figures, base.counts, counts);
    const point = { t, now, gauges: gauges(metrics), models: {} };
    for (const m of shown) {
      const g = modelGauges(metrics, m);
      const mine = over(modelFigures, base.each[m], each[m]);
      point.models[m] = { now: mine, gauges: g, kv: ratio(g.kvUsed, g.kvFree) };
    }
    points.push(point);
    while (t - points[0].t > HISTORY_S) points.shift();
    render(point.now, figures(counts, NaN), counts, point.gauges);
    for (const [id, , top, series] of CHARTS) {
      plot(document.getElementById(`chart-${id}`), series, top);
    }
    for (const m of shown) drawModel(section(m), m, point.models[m], each[m]);
    document.getElementById("scope").hidden = shown.length === 0;
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

  /** Shows model `m`'s figures in its `section`: its point `p` and its counts since start. */
  function drawModel(section, m, p, counts) {
    const at = (f) => (p.now === null ? null : f(p.now));
    const start = modelFigures(counts, NaN);
    const g = p.gauges;
    const fill = (figure, value, format) =>
      put(section.querySelector(`[data-figure="${figure}"]`), value, format);
    fill("requests-rate", at((f) => f.requests), rate);
    fill("requests-total", counts.requests, count);
    fill("errors-total", counts.errors, count);
    fill("tokens-rate", at((f) => f.tokens), rate);
    fill("tokens-total", counts.real, count);
    fill("batches-total", counts.batches, count);
    fill("queue-depth", g.queue, count);
    fill("in-flight", g.inFlight, count);
    fill("queued-tokens", g.queuedTokens, count);
    fill("busy", at((f) => f.busy), percent);
    fill("busy-total", counts.busy, seconds);
    fill("hit", at((f) => f.hit), percent);
    fill("hit-total", start.hit, percent);
    fill("padding", at((f) => f.padding), percent);
    fill("padding-total", start.padding, percent);
    fill("kv-used", p.kv, percent);
    fill("kv-pages", g.kvUsed + g.kvFree, count);
    fill("evicted-total", counts.evicted, count);
    fill("tokenizer", at((f) => f.tokenizer), percent);
    fill("tokenizer-total", start.tokenizer, percent);
    fill("compiles-total", counts.compiles, count);
    const of = (f) => (point) => f(point.models[m] ?? { now: null }); // of this model's point
    for (const [id, , top, series] of MODEL_CHARTS) {
      plot(section.querySelector(`[data-chart="${id}"]`), series.map(([n, f]) => [n, of(f)]), top);
    }
  }

  /** Model `m`'s section of the page, made from the `model` template when first asked for;
   * the sections stay in the order asked (the order served). */
  function section(m) {
    if (!sections.has(m)) {
      const made = document.getElementById("model").content.firstElementChild.cloneNode(true);
      made.dataset.model = m;
      made.querySelector(".name").textContent = m;
      for (const [id, title, , series] of MODEL_CHARTS) {
        legend(made.querySelector(`[data-legend="${id}"]`), title, series);
      }
      sections.set(m, made);
    }
    const element = sections.get(m);
    document.getElementById("models").append(element); // where it is: moved to the end
    return element;
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

  /** Writes `title` and a swatch for each of `series` into the caption `element`. */
  function legend(element, title, series) {
    const heading = document.createElement("h2");
    heading.textContent = title;
    element.append(heading);
    series.forEach(([name], i) => {
      const swatch = document.createElement("span");
      swatch.textContent = name;
      swatch.style.setProperty("--swatch", COLORS[i]);
      element.append(swatch);
    });
  }

  function build() {
    for (const [id, title, , series] of CHARTS) {
      legend(document.getElementById(`legend-${id}`), title, series);
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

  build();
  poll();
})();
