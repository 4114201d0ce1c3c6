"""The REPL's terminal helpers (`engine.repl.terminal`)."""

from engine.repl.terminal import history_path


def test_history_path_is_none_without_a_usable_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert history_path() == tmp_path / ".llm_scoring_engine_history"
    monkeypatch.setenv("HOME", str(tmp_path / "missing"))
    assert history_path() is None
