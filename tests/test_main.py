"""`python -m engine QUERY ITEM ...`: one JSON line per item, the offline scores."""

import json

import numpy as np
import pytest

import engine.__main__ as cli
import engine.engine
from engine.device.program import default_compile_cache_dir


def test_prints_one_line_per_item_with_the_offline_scores(
    tiny_path, reference, monkeypatch, capsys
):
    cache_dirs = []  # the engine's compile cache is asked for; not switched on in the tests
    monkeypatch.setattr(engine.engine, "enable_compile_cache", cache_dirs.append)
    labels = ["a", "e"]
    ids = cli.label_ids(reference.tokenizer, labels)
    cli.main(
        ["Is it?", " a cat", " the dog", "--model", tiny_path, "--dtype", "float32"]
        + [arg for label in labels for arg in ("--label", label)]
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = reference.score("Is it?", [" a cat", " the dog"], ids)
    assert [line["item"] for line in lines] == [" a cat", " the dog"]
    got = [[line["scores"][label] for label in labels] for line in lines]
    np.testing.assert_allclose(np.log(got), np.log(want), atol=1e-6)
    assert cache_dirs == [default_compile_cache_dir()]  # kept for the next run


def test_a_label_of_several_tokens_is_refused(reference):
    with pytest.raises(SystemExit, match="each label must be one token"):
        cli.label_ids(reference.tokenizer, ["a whole sentence of words"])
