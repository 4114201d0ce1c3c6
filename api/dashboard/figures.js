"use strict";
// What the dashboard computes, from what /metrics says and nothing else: the counters and
// gauges of one scrape (the server's, and each served model's), the difference of two scrapes,
// and the figures of counts over a time. `window.dashboard` holds these functions: the page's
// script draws with them, and tests check them against /metrics.
window.dashboard = (() => {
  // the dashboard's own polls and health checks are not counted as requests
  const MONITORING = new Set(["/metrics", "/dashboard", "/health", "/ping"]);
  const STAGES = ["tokenize", "queue", "batch_build", "device", "total"];
  const QUANTILES = [["p50", 0.5], ["p90", 0.9], ["p99", 0.99]];

  const number = (s) => (s === "+Inf" ? Infinity : s === "-Inf" ? -Infinity : Number(s));
  const unescape = (v) => v.replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
  const all = () => true;
  const by = (key, value) => (l) => l[key] === value;

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
  function total(metrics, name, keep = all) {
    const samples = (metrics[name] ?? []).filter((s) => keep(s.labels));
    return samples.reduce((sum, s) => sum + s.value, 0);
  }

  /** The engine counters of the samples `keep` accepts: device time, prefix cache, padding. */
  function engine(metrics, keep) {
    const of = (name, only = all) => total(metrics, name, (l) => keep(l) && only(l));
    return {
      busy: of("scoring_device_busy_seconds_total"),
      hit: of("scoring_prefix_cache_tokens_total", by("result", "hit")),
      miss: of("scoring_prefix_cache_tokens_total", by("result", "miss")),
      real: of("scoring_batch_tokens_total", by("kind", "real")),
      padded: of("scoring_batch_tokens_total", by("kind", "padded")),
    };
  }

  /** The counters of one scrape, as the dashboard adds them up (over every model). */
  function counters(metrics) {
    const request = (l) => !MONITORING.has(l.route);
    const stage = (name) =>
      Object.fromEntries(STAGES.map((s) => [s, total(metrics, name, by("stage", s))]));
    const latency = metrics.scoring_stage_seconds_bucket ?? [];
    return {
      requests: total(metrics, "scoring_http_requests_total", request),
      errors: total(metrics, "scoring_http_requests_total", (l) => request(l) && Number(l.status) >= 400),
      items: total(metrics, "scoring_items_total"),
      ...engine(metrics, all),
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

  /** The models a scrape names by its `model` labels: the engines' in the order served (the
   * engines carry the label only where several are served), then any other. */
  function models(metrics) {
    const names = new Set();
    for (const name of ["scoring_queue_depth", ...Object.keys(metrics)]) {
      for (const { labels } of metrics[name] ?? []) if ("model" in labels) names.add(labels.model);
    }
    return [...names];
  }

  /** The counters of `model` in one scrape: the requests asked of it and its engine's own. */
  function modelCounters(metrics, model) {
    const mine = by("model", model);
    const of = (name, only = all) => total(metrics, name, (l) => mine(l) && only(l));
    return {
      requests: of("scoring_model_requests_total"),
      errors: of("scoring_model_requests_total", (l) => Number(l.status) >= 400),
      batches: of("scoring_batches_total"),
      ...engine(metrics, mine),
      evicted: of("scoring_kv_pages_evicted_total"),
      compiles: of("scoring_compiles_total"),
      tokenizerHit: of("scoring_tokenizer_cache_total", by("result", "hit")),
      tokenizerMiss: of("scoring_tokenizer_cache_total", by("result", "miss")),
    };
  }

  /** The gauges of `model`'s engine in one scrape. */
  function modelGauges(metrics, model) {
    const of = (name, only = all) => total(metrics, name, (l) => l.model === model && only(l));
    return {
      queue: of("scoring_queue_depth"),
      inFlight: of("scoring_requests_in_flight"),
      queuedTokens: of("scoring_queued_tokens"),
      kvUsed: of("scoring_kv_pages", by("state", "used")),
      kvFree: of("scoring_kv_pages", by("state", "free")),
    };
  }

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

  /** The figures of one model's counts `d` (`modelCounters`, or a difference of two), its
   * rates over `dt` seconds. */
  function modelFigures(d, dt) {
    return {
      requests: d.requests / dt,
      tokens: d.real / dt,
      batches: d.batches / dt,
      busy: d.busy / dt,
      hit: ratio(d.hit, d.miss),
      padding: ratio(d.real, d.padded),
      tokenizer: ratio(d.tokenizerHit, d.tokenizerMiss),
    };
  }

  return {
    STAGES, QUANTILES, parse, counters, gauges, models, modelCounters, modelGauges, since,
    quantile, ratio, per, figures, modelFigures,
  };
})();
