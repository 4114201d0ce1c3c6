"""The Hugging Face directory loader: layouts, sharded files, and errors naming the problem."""

import json
import shutil

import numpy as np
import pytest

from engine.loaders import CheckpointError, load_checkpoint
from engine.loaders.hf import load_hf_dir


def test_tensors_map_to_our_layout(tiny_checkpoints):
    import torch
    import transformers

    path = tiny_checkpoints["qwen2"]
    ckpt = load_hf_dir(path)
    state = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32
    ).state_dict()
    layers = ckpt.params["layers"]
    np.testing.assert_array_equal(
        layers["wq"][1], state["model.layers.1.self_attn.q_proj.weight"].T
    )
    np.testing.assert_array_equal(layers["bk"][0], state["model.layers.0.self_attn.k_proj.bias"])
    np.testing.assert_array_equal(
        layers["w_down"][0], state["model.layers.0.mlp.down_proj.weight"].T
    )
    np.testing.assert_array_equal(ckpt.params["lm_head"], state["lm_head.weight"])
    assert ckpt.config.family == "qwen2" and ckpt.config.qkv_bias and not ckpt.config.qk_norm
    assert (ckpt.config.num_heads, ckpt.config.num_kv_heads, ckpt.config.head_dim) == (4, 2, 16)


def test_tied_checkpoint_has_no_lm_head(tiny_checkpoints):
    ckpt = load_hf_dir(tiny_checkpoints["qwen3"])
    assert "lm_head" not in ckpt.params
    assert ckpt.params["layers"]["q_norm"].shape == (2, 32)


def test_sharded_checkpoint_loads_the_same(tiny_checkpoints, tmp_path):
    import torch
    import transformers

    src = tiny_checkpoints["llama-untied"]
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    shutil.copy(src / "tokenizer.json", tmp_path)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    whole, sharded = load_checkpoint(src), load_checkpoint(tmp_path)
    assert whole.config == sharded.config
    for name in ("wq", "w_up", "mlp_norm"):
        np.testing.assert_array_equal(whole.params["layers"][name], sharded.params["layers"][name])
    np.testing.assert_array_equal(whole.params["lm_head"], sharded.params["lm_head"])


def _copy(src, dst, *, drop=(), config=None):
    shutil.copytree(src, dst)
    for name in drop:
        (dst / name).unlink()
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, **config}))
    return dst


def test_errors_name_the_file_and_the_problem(tiny_checkpoints, tmp_path):
    src = tiny_checkpoints["llama-untied"]
    cases = [
        (
            _copy(src, tmp_path / "a", config={"model_type": "gpt2"}),
            "unsupported model_type 'gpt2'",
        ),
        (_copy(src, tmp_path / "b", drop=["tokenizer.json"]), "missing tokenizer.json"),
        (_copy(src, tmp_path / "c", drop=["model.safetensors"]), "no model.safetensors"),
        (_copy(src, tmp_path / "d", config={"num_hidden_layers": 3}), "missing tensor 'layers.2."),
        (
            _copy(src, tmp_path / "e", config={"rope_scaling": {"rope_type": "yarn", "factor": 2}}),
            "unsupported rope_scaling type 'yarn'",
        ),
    ]
    for path, message in cases:
        with pytest.raises(CheckpointError, match=f"{path}.*{message}"):
            load_hf_dir(path)
    broken = _copy(src, tmp_path / "f", config={"hidden_size": None})
    with pytest.raises(
        CheckpointError, match=r"config\.json: Expected `int`, got `null`.*hidden_size"
    ):
        load_hf_dir(broken)
    cfg = json.loads((broken / "config.json").read_text())
    del cfg["num_attention_heads"]
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="missing or invalid field 'num_attention_heads'"):
        load_hf_dir(broken)
