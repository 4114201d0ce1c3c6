"""Where int8's error comes from: the layer matrices of a model quantised as the int8 mode does,
a kind or a layer at a time, against the model in float32, in PyTorch.

    python -m bench int8-errors [--model PATH] [--docs 64] [--texts 2000] [--no-layers]
        [--alpha 0.5] [--divisor-forms]

Each `nn.Linear` of the model's layers is replaced by `FakeInt8`, which computes what
`score_kernels.quant` defines (bf16-rounded activations, rotated and quantised per row block of
128; weights rotated and quantised per output column), dequantised and multiplied in f32, so the
error is int8's alone (the engine's int8 mode adds bf16's for the rest of the model). A decoder
is measured on W1 (`python -m bench w1`'s query and `--docs` documents, the label log-probs of
" yes"/" no"): mean and max |d log-prob|, the Kendall tau of yes-minus-no against float32, and
how those margins moved (`parity.margin_moves`: a shift shared by every document, and the
spread around it that reorders them). An embedder (a sentence-transformers directory given as
`--model`) on `--texts` texts of 8-256 tokens (`python -m bench embed`'s): the minimum and mean
cosine to its float32 embeddings.

The report's sections:
- `sources`: weights alone, activations alone and both quantised, with and without the rotation;
- `matmuls`: one kind of matrix (q, k, v, o, gate, up, down, ...) quantised in every layer;
- `layers`: every matrix of one layer quantised (left out with `--no-layers`);
- `methods`: the whole model per column without rotation (the int8 mode before the rotation),
  rotated (the int8 mode now), and rotated with GPTQ rounding (`score_kernels.gptq`) against
  the Hessians of each matrix's rotated inputs from a calibration set that the measured inputs
  are not in (W1's documents, or the embedder's texts, of another seed); then each of those
  three after SmoothQuant's smoothing: every input channel j divided by
  s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) (`--alpha`; X's maxima from the calibration set,
  W the weights of every matrix multiplying that input: q, k and v share one s, as gate and up
  do) and the weights' row j multiplied by it, so the product is unchanged but the
  activations' outlier channels move into the weights. `--divisor-forms` adds smoothing with a
  divisor per matrix (each from its own weights: q, k and v would each quantise the shared
  input apart), without and with GPTQ, and smoothing only the inputs one matrix takes alone
  (o's and down's), with GPTQ.
"""

import os
from pathlib import Path

import numpy as np
import torch

from bench import common, w1
from bench.embed import texts_of
from bench.parity import kendall_tau, margin_moves, margins
from score_kernels import gptq, quant

QUICK = dict(docs=8, doc_tokens=(20, 40), texts=64, layers=False, calibration=4)


def parse(argv):
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=64)
    p.add_argument("--query-tokens", type=int, default=25)
    p.add_argument("--doc-tokens", type=int, nargs=2, default=(130, 230))
    p.add_argument("--texts", type=int, default=2000, help="an embedder's measured texts")
    p.add_argument("--calibration", type=int, default=16, help="GPTQ's W1 documents (x16 texts)")
    p.add_argument("--alpha", type=float, default=0.5, help="SmoothQuant's migration strength")
    p.add_argument(
        "--divisor-forms",
        action="store_true",
        help="methods: also smoothing with a divisor per matrix, and only where one matrix "
        "takes the input",
    )
    p.add_argument("--no-layers", dest="layers", action="store_false")
    return common.parse_args(p, argv, QUICK)


def main(argv=None) -> dict:
    args = parse(argv)
    args.dtype = "float32"
    path = common.model_path(args)
    side = Embedder(args, path) if is_embedder(path) else Decoder(args, path)
    report = {
        "workload": "int8-errors",
        "description": "int8 error by source, matrix kind, layer and method, vs float32",
        **common.environment(args, path, side.config),
        "metric": side.metric,
        **measure(side, args.layers, args.alpha, args.divisor_forms),
    }
    common.publish(report, args, common.model_tag(args, path), chart, summary(report))
    return report


def measure(side, layers: bool, alpha: float, divisor_forms: bool = False) -> dict:
    """Every section of the report, each entry the metrics of one `FakeInt8` placement."""
    sites = list(linears(side.layers))
    kinds = list(dict.fromkeys(kind for _, kind, _ in sites))
    everything = {(i, k) for i, k, _ in sites}
    sources = {
        f"{what}, {rot}": side.measure(everything, weights=w, acts=a, rotate=r)
        for rot, r in (("per column", False), ("rotated", True))
        for what, w, a in (
            ("weights", True, False),
            ("activations", False, True),
            ("both", True, True),
        )
    }
    out = {"sources": sources}
    out["matmuls"] = {k: side.measure({(i, k) for i, _ in everything}) for k in kinds}
    if layers:
        count = len(side.layers)
        out["layers"] = {str(n): side.measure({(n, k) for k in kinds}) for n in range(count)}
    out["methods"] = {
        "per column (before the rotation)": sources["both, per column"],
        "rotated (the int8 mode)": sources["both, rotated"],
        "rotated + GPTQ": side.measure(everything, hessians=side.hessians()),
    }
    smooth = side.smoothing(alpha)
    out["methods"] |= {
        f"smoothed (alpha {alpha}), per column": side.measure(everything, smooth, rotate=False),
        f"smoothed (alpha {alpha}), rotated": side.measure(everything, smooth),
        f"smoothed (alpha {alpha}), rotated + GPTQ": side.measure(
            everything, smooth, hessians=side.hessians(smooth)
        ),
    }
    if divisor_forms:
        own = side.smoothing(alpha, "matrix")
        alone = side.smoothing(alpha, "alone")
        out["methods"] |= {
            f"smoothed (alpha {alpha}), a divisor per matrix, rotated": side.measure(
                everything, own
            ),
            f"smoothed (alpha {alpha}), a divisor per matrix, rotated + GPTQ": side.measure(
                everything, own, hessians=side.hessians(own)
            ),
            f"smoothed (alpha {alpha}) where one matrix takes the input, rotated + GPTQ": (
                side.measure(everything, alone, hessians=side.hessians(alone))
            ),
        }
    return out


class FakeInt8:
    """`score_kernels.quant`'s arithmetic on an `nn.Linear` (weight [N, K]), dequantised."""

    def __init__(self, linear, *, weights=True, acts=True, rotate=True, hessian=None, smooth=None):
        self.linear, self.acts, self.rotate = linear, acts, rotate
        self.smooth = None if smooth is None else torch.from_numpy(smooth).float()  # [K]
        w = linear.weight.detach().double().T.numpy()  # [K, N]
        if smooth is not None:
            w = w * smooth[:, None]
        if rotate:
            w = quant.rotate_weights(w)
        if weights:
            q, scale = (
                gptq.round_columns(w, hessian.numpy())
                if hessian is not None
                else quant.round_columns(w)
            )
            w = q * scale
        self.w = torch.from_numpy(np.asarray(w, np.float32))  # [K, N]

    def __call__(self, x):  # [..., K] -> [..., N]
        if self.smooth is not None:
            x = x / self.smooth
        x = x.to(torch.bfloat16).float()
        if self.rotate:
            x = rotate_rows(x)
        if self.acts:
            x = quantized_rows(x)
        y = x @ self.w
        return y if self.linear.bias is None else y + self.linear.bias


def rotate_rows(x):  # f32[..., K]: each block rotated times its Hadamard matrix
    def rotated(part):
        width = part.shape[-1]
        if not quant.rotated(width):
            return part
        return part @ torch.from_numpy(quant.sylvester(width)).float()

    return per_block(x, rotated)


def quantized_rows(x):  # f32[..., K], each row block rounded to its int8 grid
    def rounded(part):
        amax = part.abs().amax(-1, keepdim=True)
        scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
        return torch.round(part / scale).clamp(-127, 127) * scale

    return per_block(x, rounded)


def per_block(x, fn):  # f32[..., K]: `fn` on each of `quant.block_widths`' blocks
    parts, start = [], 0
    for width in quant.block_widths(x.shape[-1]):
        parts.append(fn(x[..., start : start + width]))
        start += width
    return torch.cat(parts, -1)


def linears(layers):
    """(layer index, kind, (parent module, attribute)) of every nn.Linear in `layers`, placed
    or not."""
    for i, layer in enumerate(layers):
        for name, module in layer.named_modules():
            if isinstance(module, torch.nn.Linear | Placed):
                parent, _, attr = name.rpartition(".")
                yield i, name, (layer.get_submodule(parent) if parent else layer, attr)


class Placed(torch.nn.Module):
    """A `FakeInt8` in a model, where its nn.Linear was (which it holds unregistered)."""

    def __init__(self, fake: FakeInt8):
        super().__init__()
        self.fake = fake

    def forward(self, x):
        return self.fake(x)


def place(
    layers, chosen: set, hessians: dict | None = None, smooth: dict | None = None, **options
) -> None:
    """FakeInt8 at the (layer, kind) sites in `chosen`, the original nn.Linear everywhere else;
    `hessians` and `smooth` by site."""
    for i, kind, (parent, attr) in list(linears(layers)):
        module = getattr(parent, attr)
        linear = module.fake.linear if isinstance(module, Placed) else module
        if (i, kind) in chosen:
            extra = {
                "hessian": hessians[(i, kind)] if hessians else None,
                "smooth": smooth[(i, kind)] if smooth else None,
            }
            setattr(parent, attr, Placed(FakeInt8(linear, **extra, **options)))
        else:
            setattr(parent, attr, linear)


def recorded(layers, run, record, shares: dict | None = None) -> None:
    """`record(site, x)` with each nn.Linear's real input rows f32[rows, K] over `run()`;
    `shares`, where given, filled with each site's first site multiplying the same input (a
    layer's q, k and v; gate and up), itself where none does."""
    hooks, last = [], [None, None]  # the site called last and its input
    for i, kind, (parent, attr) in linears(layers):

        def hook(module, inputs, output, key=(i, kind)):
            if shares is not None:
                shares[key] = shares[last[0]] if inputs[0] is last[1] else key
                last[:] = key, inputs[0]
            x = inputs[0].reshape(-1, inputs[0].shape[-1])
            record(key, x[x.abs().sum(1) > 0].detach().float())

        hooks.append(getattr(parent, attr).register_forward_hook(hook))
    try:
        run()
    finally:
        for h in hooks:
            h.remove()


def input_hessians(layers, run, smooth: dict | None = None) -> dict:
    """X^T X f64[K, K] of each nn.Linear's rotated inputs over `run()` (divided by `smooth`'s
    scales first where given)."""
    hessians = {}

    def record(key, x):
        if smooth:
            x = x / torch.from_numpy(smooth[key]).float()
        x = rotate_rows(x.to(torch.bfloat16).float()).double()
        hessians[key] = hessians.get(key, 0) + x.T @ x

    recorded(layers, run, record)
    return hessians


def input_maxima(layers, run, shares: dict | None = None) -> dict:
    """max |X_j| f64[K] of each nn.Linear's input channels over `run()` (`shares`: as
    `recorded` fills it)."""
    maxima = {}

    def record(key, x):
        top = x.abs().amax(0).double().numpy()
        maxima[key] = np.maximum(maxima[key], top) if key in maxima else top

    recorded(layers, run, record, shares)
    return maxima


class Side:
    """A model measured against its float32 self: `_run(inputs)` computes its outputs,
    `_compare(outputs)` the metrics against `self.reference`."""

    layers: object  # the model's nn.ModuleList of layers
    inputs: list  # what is measured
    calibration: list  # GPTQ's inputs, none of them measured

    def hessians(self, smooth: dict | None = None) -> dict:
        place(self.layers, set())
        return input_hessians(self.layers, lambda: self._run(self.calibration), smooth)

    def smoothing(self, alpha: float, divisors: str = "input") -> dict:
        """SmoothQuant's scales f32[K] by site (`quant.smoothing`), from the calibration set's
        input maxima. `divisors`: "input", one per input from the weights of every matrix
        multiplying it (a layer's q, k and v share theirs, as they share one quantisation of
        their input in the int8 kernels); "matrix", each matrix's from its own weights; "alone",
        the input's where one matrix alone multiplies it, none (ones) where several do."""
        if divisors not in ("input", "matrix", "alone"):
            raise ValueError(f"divisors: {divisors!r} is not input, matrix or alone")
        place(self.layers, set())
        shares = {}
        maxima = input_maxima(self.layers, lambda: self._run(self.calibration), shares)
        weights = {
            (i, k): getattr(p, a).weight.detach().double().numpy()
            for i, k, (p, a) in linears(self.layers)
        }
        stacked = {}
        for site, owner in shares.items():
            stacked.setdefault(owner if divisors != "matrix" else site, []).append(weights[site])
        scales = {
            o: quant.smoothing(maxima[shares[o]], np.abs(np.concatenate(w)).max(0), alpha)
            for o, w in stacked.items()
        }
        if divisors == "matrix":
            return scales
        several = {owner for owner, w in stacked.items() if len(w) > 1}
        shared = several if divisors == "alone" else set()
        return {
            site: np.ones_like(scales[owner]) if owner in shared else scales[owner]
            for site, owner in shares.items()
        }

    def measure(self, chosen: set, smooth=None, hessians=None, **options) -> dict:
        place(self.layers, chosen, hessians, smooth, **options)
        outputs = self._run(self.inputs)
        place(self.layers, set())
        return self._compare(outputs)


class Decoder(Side):
    """A causal LM on W1: label log-probs against float32."""

    metric = "W1 label log-probs: mean and max |d log-prob| and Kendall tau vs float32"

    def __init__(self, args, path: Path):
        from bench.baseline import load_transformers
        from engine import load_model

        torch.set_num_threads(os.cpu_count())
        engine = load_model(path, dtype="float32")
        self.config = engine.model_config
        self.inputs, self.labels = self._seqs(args, engine, args.seed, args.docs)
        self.calibration, _ = self._seqs(args, engine, args.seed + 1, args.calibration)
        self.model = load_transformers(path, "float32")
        self.layers = self.model.model.layers
        self.reference = self._run(self.inputs)

    @staticmethod
    def _seqs(args, engine, seed: int, docs: int):
        args = common.argparse.Namespace(**{**vars(args), "seed": seed, "docs": docs})
        query, documents, labels = w1.build(args, engine)
        return engine.sequences(query, documents, item_first=False), labels

    def _run(self, seqs) -> np.ndarray:
        from bench.baseline import hf_label_logprobs

        return hf_label_logprobs(self.model, seqs, self.labels, batch_size=8)

    def _compare(self, logprobs: np.ndarray) -> dict:
        d = np.abs(logprobs - self.reference)
        shift, spread = margin_moves(logprobs, self.reference)
        return {
            "mean_abs_logprob_dev": float(d.mean()),
            "max_abs_logprob_dev": float(d.max()),
            "kendall_tau": kendall_tau(margins(logprobs), margins(self.reference)),
            "margin_shift": shift,
            "margin_spread": spread,
        }


class Embedder(Side):
    """A sentence-transformers embedder on `bench embed`'s texts: cosine to float32."""

    metric = "embeddings of bench embed's texts: min and mean cosine to float32"

    def __init__(self, args, path: Path):
        from sentence_transformers import SentenceTransformer

        from engine.loaders import load_checkpoint

        torch.set_num_threads(os.cpu_count())
        checkpoint = load_checkpoint(path)
        self.config = checkpoint.config
        self.model = SentenceTransformer(str(path), device="cpu")
        self.inputs = texts_of(checkpoint.tokenizer, args.texts, args.seed)
        self.calibration = texts_of(checkpoint.tokenizer, args.calibration * 16, args.seed + 1)
        self.layers = self.model[0].auto_model.encoder.layer
        self.reference = self._run(self.inputs)

    def _run(self, texts) -> np.ndarray:
        return self.model.encode(texts, batch_size=64, normalize_embeddings=True)

    def _compare(self, vectors: np.ndarray) -> dict:
        cosine = np.sum(vectors.astype(np.float64) * self.reference, axis=1)
        return {"min_cosine": float(cosine.min()), "mean_cosine": float(cosine.mean())}


def is_embedder(path: Path) -> bool:
    return path.is_dir() and (path / "modules.json").exists()


def headline(metrics: dict) -> str:
    if "min_cosine" in metrics:
        return f"min cos {metrics['min_cosine']:.5f}"
    return (
        f"mean {metrics['mean_abs_logprob_dev']:.3f} / max {metrics['max_abs_logprob_dev']:.3f},"
        f" tau {metrics['kendall_tau']:.3f}, margin spread {metrics['margin_spread']:.3f}"
    )


def summary(report: dict) -> str:
    return "; ".join(f"{name}: {headline(m)}" for name, m in report["methods"].items())


def chart(report: dict, png) -> None:
    key = "min_cosine" if "min_cosine" in report["methods"]["rotated (the int8 mode)"] else None
    value = (lambda m: 1 - m[key]) if key else (lambda m: m["mean_abs_logprob_dev"])
    bars = {f"only {k}": value(m) for k, m in report["matmuls"].items()}
    bars |= {name: value(m) for name, m in report["methods"].items()}
    unit = "1 - min cosine" if key else "mean |d log-prob|"
    title = f"int8 error by matrix kind and method, {common.report_tag(report)}"
    common.bar_chart(png, title, bars, unit, summary(report))
