"""Calibrated int8 roundings kept between starts, beside the compile cache: the calibration
pass and the rounding (`engine.calibration`: `EngineConfig.int8_rounding="gptq"`, or
`int8_smoothing`) cost a load tens of seconds; a restart of the same checkpoint reads their
result instead.

A checkpoint's roundings live in a directory of their own, named by the checkpoint's
`fingerprint` (its config, tokenizer and weights, the calibration texts, the method and the
arithmetic's version), one file per layer stack by its digest
(`score_kernels.calibration.digest`): the stack's int8 values, column scales and smoothing
divisors, or a mark that the calibration left it to plain nearest rounding (a stack the pass
did not see in every layer). Files are written whole (to a temporary name, then
renamed), so a start that dies part way leaves only complete entries; a stack without an entry
makes the start calibrate again (`RoundingMiss`), filling in what is missing.
"""

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from engine.calibration import sequences
from engine.loaders import Checkpoint
from score_kernels import gptq, quant
from score_kernels.calibration import Hessians, digest

# the calibration's arithmetic (the recording, the rotation, GPTQ, the int8 grid): a change to
# any of it changes this, so that no earlier rounding is read for it
VERSION = 2
FOLDER = "int8-calibrated"


class RoundingMiss(Exception):
    """A layer stack the cache has no rounding for, and no Hessians to compute it."""


class RoundingCache:
    """The calibrated roundings of one checkpoint's layer stacks under `directory`; with `hessians`
    (`score_kernels.calibration.Hessians`) those not there yet are rounded by them and written,
    without, they raise `RoundingMiss`. `rounded(w)` answers as `Hessians.rounded` does."""

    def __init__(self, directory: Path, hessians: Hessians | None = None):
        self.directory, self.hessians = Path(directory), hessians
        self._read: dict[str, quant.Rounded | None] = {}

    def calibrated(self, hessians: Hessians) -> "RoundingCache":
        """This cache, rounding what it lacks by `hessians`."""
        return RoundingCache(self.directory, hessians)

    def empty(self) -> bool:
        """Whether no rounding is kept yet (a first start calibrates without trying to read)."""
        return not self.directory.is_dir() or not any(self.directory.iterdir())

    def rounded(self, w):
        """w [L, K, N] (or [K, N]) as the calibration rounds it (a `quant.Rounded`), or w itself
        where it leaves it to plain nearest rounding."""
        key = digest(w)
        if key not in self._read:
            self._read[key] = self._entry(key, w)
        stored = self._read[key]
        return w if stored is None else stored

    def _entry(self, key: str, w) -> quant.Rounded | None:
        values, unseen = self._path(key, ".npz"), self._path(key, ".none")
        if values.exists():
            with np.load(values) as f:
                return quant.Rounded(f["q"], f["scale"], f.get("smooth"))
        if unseen.exists():
            return None
        if self.hessians is None:
            raise RoundingMiss(key)
        rounded = self.hessians.rounded(w, key)
        if rounded is w:
            self._write(unseen, lambda f: None)
            return None
        smooth = {} if rounded.smooth is None else {"smooth": rounded.smooth}
        self._write(values, lambda f: np.savez(f, q=rounded.q, scale=rounded.scale, **smooth))
        return rounded

    def _path(self, key: str, suffix: str) -> Path:
        return self.directory / f"{key}{suffix}"

    def _write(self, path: Path, fill) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=self.directory, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                fill(f)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def for_checkpoint(
    compile_cache_dir: str | None, checkpoint: Checkpoint, method: tuple = ("gptq", 0.0)
) -> RoundingCache | None:
    """The cache of `checkpoint`'s roundings by `method` (`engine.calibration.method`) under
    `compile_cache_dir` (None: none kept)."""
    if compile_cache_dir is None:
        return None
    return RoundingCache(Path(compile_cache_dir) / FOLDER / fingerprint(checkpoint, method))


def fingerprint(checkpoint: Checkpoint, method: tuple = ("gptq", 0.0)) -> str:
    """What the calibrated roundings of `checkpoint` by `method` depend on, as a digest: its
    config, tokenizer and weights, the calibration texts, the method, and the arithmetic
    (`VERSION`, GPTQ's damping, the activation block)."""
    h = hashlib.blake2b(digest_size=16)
    settings = (VERSION, method, gptq.DAMP, quant.ACT_BLOCK, repr(checkpoint.config), sequences())
    h.update(repr(settings).encode())
    h.update(checkpoint.tokenizer.to_str().encode())
    for name, leaf in _leaves(checkpoint.params):
        h.update(f"{name} {digest(leaf)}".encode())
    return h.hexdigest()


def _leaves(params: dict, prefix: str = ""):
    """(dotted name, array) of a nested dict of arrays, in name order."""
    for name in sorted(params):
        value = params[name]
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{name}.")
        elif value is not None:
            yield f"{prefix}{name}", np.asarray(value)
