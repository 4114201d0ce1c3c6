"""Host hot paths: the compiled Cython modules against their pure-Python twins.

    python -m bench.bench_native [--repeats 20]

Workloads (token ids as Python int lists, as the tokenizer hands them over):
- W2-like: 500 sequences, each one shared 2000-token prompt followed by 20 distinct tokens;
- unrelated: 64 sequences of 150 random tokens, sharing nothing.
Timed: `group_by_prefix` (radix tree) and `pack_chunks` (flat layout of the grouped batch). The
median of `--repeats` calls is reported; measurements only, nothing is asserted.
"""

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import _native

VOCAB = 49152


def w2_like(rng: np.random.Generator, items: int = 500, prompt: int = 2000, item: int = 20):
    shared = rng.integers(0, VOCAB, prompt).tolist()
    return [shared + rng.integers(0, VOCAB, item).tolist() for _ in range(items)]


def unrelated(rng: np.random.Generator, count: int = 64, length: int = 150):
    return [rng.integers(0, VOCAB, length).tolist() for _ in range(count)]


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def bench_workload(name: str, seqs: list[list[int]], repeats: int) -> None:
    chunks = _native.IMPLEMENTATIONS["python"].group_by_prefix(seqs)
    tokens = sum(p + sum(len(seqs[m]) - p for m in members) for p, members in chunks)
    print(f"\n{name}: {len(seqs)} sequences, {sum(map(len, seqs))} tokens -> {tokens} packed")
    print(f"{'operation':<18}" + "".join(f"{impl:>12}" for impl in _native.IMPLEMENTATIONS))
    for op, run in (
        ("group_by_prefix", lambda impl: impl.group_by_prefix(seqs)),
        ("pack_chunks", lambda impl: impl.pack_chunks(seqs, chunks)),
    ):
        ms = {
            impl_name: median_ms(lambda impl=impl, run=run: run(impl), repeats)
            for impl_name, impl in _native.IMPLEMENTATIONS.items()
        }
        row = "".join(f"{v:>9.3f} ms" for v in ms.values())
        speedup = f"  x{ms['python'] / ms['native']:.1f}" if "native" in ms else ""
        print(f"{op:<18}{row}{speedup}")


def main(argv: list[str] | None = None) -> None:
    """Time every implementation on both workloads and print milliseconds and the speed-up."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not _native.COMPILED:
        print("compiled modules not built: timing the pure-Python twins only")
    rng = np.random.default_rng(args.seed)
    bench_workload("W2-like", w2_like(rng), args.repeats)
    bench_workload("unrelated", unrelated(rng), args.repeats)


if __name__ == "__main__":
    main()
