"""Each model family against transformers on tiny random checkpoints (f32, one by one)."""

import functools

import jax
import numpy as np
import pytest

from bench.baseline import hf_label_logprobs
from bench.encoders import write_encoder
from engine import load_model
from engine.device.program import DeviceProgram
from engine.host.packing import empty_batch
from engine.loaders import load_checkpoint
from engine.models import FAMILIES, decoder, encoder
from engine.models.rows import HEAD_ROWS
from engine.plan import costs
from engine.tasks.base import exactly
from score_kernels import devices
from tests.conftest import CORPUS, FAMILY_CONFIGS, TINY_ENCODER


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(0)


@pytest.mark.parametrize("name", list(FAMILY_CONFIGS))
def test_family_matches_transformers(name, tiny_checkpoints, rng):
    import torch
    import transformers

    path = tiny_checkpoints[name]
    # eager: the attention that applies Gemma 2's score soft-capping
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    model = load_model(path, dtype="float32")
    lengths = [1, 2, 7, 33, 64, 150, 300]  # 300 > llama3-scaled's original context of 64
    seqs = [rng.integers(0, 384, n).tolist() for n in lengths]
    labels = [5, 17, 383]
    ours = model.row_outputs(seqs, [labels] * len(seqs))
    ref = hf_label_logprobs(hf, seqs, labels)
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_many_score_rows_equal_one_by_one(reference, rng):
    """More score rows than one head step (`HEAD_ROWS`, not a multiple of it) in one packed batch
    give each row's log-probs as scoring it alone does."""
    prompt = rng.integers(0, 384, 40).tolist()
    seqs = [prompt + rng.integers(0, 384, 3).tolist() for _ in range(HEAD_ROWS + 37)]
    labels = [[5, 17, 383]] * len(seqs)
    packed = reference.row_outputs(seqs, labels)
    alone = np.concatenate([reference.row_outputs([s], labels[:1]) for s in seqs])
    # a GPU's matmuls of another shape sum f32 in another order: 2 of 495 log-probs 1.1e-5 (20
    # ulps) apart at -5.9 on an H100
    rtol = 0 if devices.backend() == "cpu" else 4e-6
    np.testing.assert_allclose(packed, alone, atol=1e-5, rtol=rtol)


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_sliding_windows_packed_equal_one_by_one(name, tiny_checkpoints, rng):
    """Sequences sharing a prefix longer than the 16-key window, packed into one batch, score as
    each does alone: the window cuts into the shared prefix or past it, per token."""
    model = load_model(tiny_checkpoints[name], dtype="float32", progress=False)
    assert model.model_config.window == 16
    prefix = rng.integers(0, 384, 40).tolist()
    seqs = [prefix + rng.integers(0, 384, n).tolist() for n in (1, 5, 15, 16, 17, 40)]
    seqs += [rng.integers(0, 384, 70).tolist()]
    labels = [[5, 17, 383]] * len(seqs)
    packed = model.row_outputs(seqs, labels)
    alone = np.concatenate([model.row_outputs([s], labels[:1]) for s in seqs])
    np.testing.assert_allclose(packed, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["decoder", "cross-encoder"])
def test_the_last_layer_goes_on_past_attention_at_the_score_rows_alone(
    kind, tiny_checkpoints, tmp_path, rng
):
    """When the output reads only the score rows (a decoder's label head, a CLS classifier),
    the last layer's projection and MLP skip every other token: the outputs are those of every
    layer on every row, and XLA counts at least those matmuls' flops of the other rows fewer."""
    if kind == "decoder":
        path = tiny_checkpoints["llama-untied"]
    else:
        fields = dict(TINY_ENCODER, type_vocab_size=2)
        path = write_encoder(
            tmp_path,
            "BertConfig",
            fields,
            "bert",
            seed=1,
            corpus=CORPUS,
            model_max_length=96,
            vocab=300,
            perturb=0.3,
        )
    program = DeviceProgram(load_checkpoint(path), dtype="float32", dense="xla", attention="xla")
    cfg = program.config
    t, rows = 256, np.array([3, 70, 71, 200, 255], np.int32)
    batch = empty_batch(t, len(rows), 2, 64)  # every token attends to itself
    batch = batch._replace(
        tokens=rng.integers(0, min(cfg.vocab_size, 300), t).astype(np.int32),
        score_rows=rows,
        label_ids=np.zeros((len(rows), 2), np.int32),
    )

    def compiled(forward):
        return jax.jit(forward).lower(program.params, batch, None).compile()

    forward = program.task.forward_of(program.attention, program.dense, exact=True, unroll=True)
    cut = compiled(forward)
    # every token's final state, from the same stack run whole: the output of those at the rows
    whole = compiled(
        exactly(
            functools.partial(
                program.task.backbone.forward,
                cfg=cfg,
                family=FAMILIES[cfg.family],
                attention=program.attention,
                dense=program.dense,
                output=decoder.last_hidden if kind == "decoder" else encoder.states,
                unroll=True,
                **({"rows": decoder.every_token} if kind == "decoder" else {}),
            )
        )
    )
    states = whole(program.params, batch, None)[0]  # f32[T, E]
    p, dense = program.params, program.dense
    # the head on the whole run's states, at the cut program's precision (a GPU's f32 default
    # is TF32)
    if kind == "decoder":
        head = exactly(
            lambda h: decoder.label_logprobs(h[rows], batch.label_ids, p["head"], cfg, dense)
        )
    else:
        head = exactly(lambda h: encoder.pair_logits(h, batch, p, cfg, dense))
    np.testing.assert_allclose(cut(p, batch, None)[0], head(states), atol=1e-6, rtol=0)
    m = p["matrices"]
    past_attention = sum(np.prod(m[k].shape[1:]) for k in m if k != "qkv")  # o and the MLP's
    head_flops = costs._cost(jax.jit(head).lower(states).compile()).flops
    saved = costs._cost(whole).flops - costs._cost(cut).flops
    assert saved >= 2 * (t - len(rows)) * past_attention - head_flops
