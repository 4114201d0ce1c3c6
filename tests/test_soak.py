"""`python -m bench soak` in a short form on the tiny model: 128 clients for 10 s of mixed score
and rerank requests over HTTP, every answer checked against the in-process engine, nothing lost,
and the serving process's memory and file descriptors flat after the warm-up."""

import json

from bench import soak

# measured on a quiet 2-core machine: +3.5 to +11.8 MiB, 0 descriptors (the descriptors sampled
# once their count settles); with three busy processes beside it on the two cores, +33 MiB (the
# allocator keeps what the run's deeper queues took). A leak of 64 KiB per request would pass
# the bound by the run's ~1,000th request. The full-size soaks' figures are in
# docs/performance.md
RSS_GROWTH_MIB = 64
FD_GROWTH = 4


def test_soak_answers_everything_correctly_without_leaking(tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "soak.json"
    soak.main(
        [
            *("--model", str(tiny_checkpoints["llama-untied"]), "--dtype", "float32"),
            *("--token-budget", "512", "--clients", "128", "--seconds", "10"),
            *("--warmup", "3", "--pool", "64", "--no-progress", "--json", str(out)),
        ]
    )
    report = json.loads(out.read_text())
    for phase in ("warmup", "run"):
        counts = report[phase]
        assert counts["sent"] == counts["answered"] == counts["correct"] > 0, counts
        assert counts["errors"] == counts["errors_5xx"] == counts["lost"] == 0, counts
        assert counts["max_log_deviation"] <= report["tolerance"] == 1e-4
    assert report["run"]["sent"] > 128  # every client came back for more
    assert report["server_after"] == {"in_flight": 0, "queue_depth": 0, "failed_batches": 0}
    assert 0 < report["process_after_warmup"]["rss_mib"] <= report["peak_rss_mib"]
    assert report["rss_growth_mib"] < RSS_GROWTH_MIB, report["process_at_end"]
    assert report["fd_growth"] < FD_GROWTH, report["process_at_end"]
    line = capsys.readouterr().out.strip()
    assert line.startswith("soak llama-untied float32: 128 clients") and "lost 0 errors 0;" in line
