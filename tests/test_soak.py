"""`python -m bench soak` in a short form: closed-loop clients post every route the model
serves over HTTP, every answer checked against the same request sent alone, nothing lost, the
serving process's memory and file descriptors flat after the warm-up; then a phase of injected
device faults in which only the requests of the failed batches fail. On the tiny decoder (label
scores and three rerank routes), on the real all-MiniLM-L6-v2 (embeddings behind three APIs,
token vectors, similarity, reranks by cosine), and on both in one server."""

import json

from bench import soak

# measured on a quiet 2-core machine: +3.5 to +11.8 MiB, 0 descriptors (the descriptors sampled
# once their count settles); with three busy processes beside it on the two cores, +33 MiB (the
# allocator keeps what the run's deeper queues took). A leak of 64 KiB per request would pass
# the bound by the run's ~1,000th request. The full-size soaks' figures are in
# docs/performance-history.md
RSS_GROWTH_MIB = 64
FD_GROWTH = 4


def run_soak(tmp_path, model, *options, serve: str = "--model") -> dict:
    out = tmp_path / "soak.json"
    soak.main(
        [
            *(serve, str(model), "--dtype", "float32", *options),
            *("--fault-every", "4", "--no-progress", "--json", str(out)),
        ]
    )
    return json.loads(out.read_text())


def check_answers(report: dict, routes: list[str]) -> None:
    assert report["routes"] == routes
    assert report["tolerance"] == {"scores_log": 1e-4, "values": 1e-5}
    for phase in ("warmup", "run"):
        counts = report[phase]
        assert counts["sent"] == counts["answered"] == counts["correct"] > 0, counts
        assert counts["errors"] == counts["errors_5xx"] == counts["lost"] == 0, counts
        assert counts["max_gap"] <= 1.0
    by_route = report["run"]["routes"]
    assert sorted(by_route) == routes
    assert all(c["sent"] == c["correct"] > 0 for c in by_route.values()), by_route
    assert report["server_after"] == {"in_flight": 0, "queue_depth": 0, "failed_batches": 0}


def check_faults(report: dict) -> None:
    """Only the failed batches' requests fail; every other answer is still exact."""
    faults = report["faults"]
    assert faults["failed_batches"] == faults["injected"] > 0, faults
    assert faults["lost"] == 0 and faults["answered"] == faults["correct"] > 0, faults
    assert 0 < faults["errors"] <= faults["requests_in_failed_batches"], faults
    assert faults["server_after"] == {"in_flight": 0, "queue_depth": 0}


def test_a_decoder_answers_every_route_exactly_without_leaking(tiny_checkpoints, tmp_path, capsys):
    report = run_soak(
        tmp_path,
        tiny_checkpoints["llama-untied"],
        *("--token-budget", "512", "--clients", "128", "--seconds", "10"),
        *("--warmup", "3", "--pool", "64", "--fault-seconds", "5"),
    )
    check_answers(report, ["/rerank", "/v1/rerank", "/v1/score", "/v2/rerank"])
    assert report["run"]["sent"] > 128  # every client came back for more
    assert 0 < report["process_after_warmup"]["rss_mib"] <= report["peak_rss_mib"]
    assert report["rss_growth_mib"] < RSS_GROWTH_MIB, report["process_at_end"]
    assert report["fd_growth"] < FD_GROWTH, report["process_at_end"]
    check_faults(report)
    line = capsys.readouterr().out.strip()
    assert line.startswith("soak llama-untied float32: 128 clients") and "lost 0 errors 0;" in line


def test_an_embedder_answers_every_route_exactly_under_faults(minilm, tmp_path):
    report = run_soak(
        tmp_path,
        minilm,
        *("--clients", "32", "--seconds", "4", "--warmup", "2", "--pool", "20"),
        *("--fault-seconds", "4"),
    )
    routes = ["/embed", "/embed_all", "/rerank", "/similarity", "/v1/embeddings", "/v1/rerank"]
    check_answers(report, [*routes, "/v2/embed", "/v2/rerank"])
    check_faults(report)


def test_two_models_in_one_server_answer_as_each_alone(tiny_checkpoints, minilm, tmp_path):
    """Each model's bodies (naming it, or on the routes it answers by default) under load in
    one server equal that model's own server's answers to each body alone."""
    models = tmp_path / "models.toml"
    models.write_text(
        f'[[models]]\nname = "scorer"\nmodel = "{tiny_checkpoints["llama-untied"]}"\n'
        f'[[models]]\nname = "embedder"\nmodel = "{minilm}"\ndefault_for = ["rerank"]\n'
    )
    report = run_soak(
        tmp_path,
        models,
        *("--clients", "32", "--seconds", "4", "--warmup", "2", "--pool", "24"),
        *("--fault-seconds", "4"),
        serve="--models",
    )
    scorer, embedder = report["models"]
    assert scorer["routes"] == ["/v1/score", "/generative_scoring", "/v1/rerank", "/v2/rerank"]
    assert embedder["routes"][:3] == ["/v1/rerank", "/v2/rerank", "/rerank"]  # default_for
    routes = ["/embed", "/embed_all", "/rerank", "/similarity", "/v1/embeddings", "/v1/rerank"]
    check_answers(report, [*routes, "/v1/score", "/v2/embed", "/v2/rerank"])
    check_faults(report)
    # the scorer's pool, half the default, within the budget; the embedder keeps none
    assert 0 < scorer["kv_pool_bytes"] <= report["kv_pool_budget_bytes"] // 2
    assert embedder["kv_pool_bytes"] == 0
