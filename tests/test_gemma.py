"""Gemma 2 and 3 configs as their checkpoints spell them (older and newer config.json forms)."""

import pytest

from engine.models import RopeScaling
from engine.models.gemma import config2, config3

BASE = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "hidden_activation": "gelu_pytorch_tanh",
}


def test_gemma3_older_config_form():
    hf = {
        **BASE,
        "num_hidden_layers": 12,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "rope_theta": 1e6,
        "rope_local_base_freq": 1e4,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "query_pre_attn_scalar": 256,
    }
    cfg = config3(hf)
    assert cfg.sliding_layers == tuple(i not in (5, 11) for i in range(12))
    assert (cfg.sliding_window, cfg.window) == (512, 512)
    assert (cfg.rope_theta, cfg.local_rope_theta) == (1e6, 1e4)
    assert cfg.rope_scaling == RopeScaling(rope_type="linear", factor=8.0)
    assert cfg.attention_scale == 256**-0.5
    assert cfg.qk_norm and cfg.sandwich_norms and cfg.embed_scale
    assert (cfg.attn_softcap, cfg.final_softcap) == (0.0, 0.0)


def test_gemma2_alternates_from_a_sliding_layer():
    hf = {
        **BASE,
        "num_hidden_layers": 4,
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    }
    cfg = config2(hf)
    assert cfg.sliding_layers == (True, False, True, False)
    assert (cfg.attn_softcap, cfg.final_softcap) == (50.0, 30.0)
    assert cfg.attention_scale == 32**-0.5  # query_pre_attn_scalar defaults to head_dim
    assert not cfg.qk_norm and cfg.local_rope_theta == 0.0


def test_no_window_means_no_sliding_layers():
    cfg = config2({**BASE, "num_hidden_layers": 2, "sliding_window": None})
    assert (cfg.sliding_layers, cfg.window) == ((), 0)


@pytest.mark.parametrize(
    "types", [["sliding_attention"], ["sliding_attention", "chunked_attention"]]
)
def test_bad_layer_types_are_refused(types):
    hf = {**BASE, "num_hidden_layers": 2, "sliding_window": 8, "layer_types": types}
    with pytest.raises(ValueError, match="layer_types must name 2"):
        config3(hf)


def test_scaled_rope_on_sliding_layers_is_refused():
    params = {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
    }
    hf = {**BASE, "num_hidden_layers": 2, "sliding_window": 8, "rope_parameters": params}
    with pytest.raises(ValueError, match="sliding-window layers"):
        config3(hf)
