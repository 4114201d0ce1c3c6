"""Tensors of a `torch.save` file (`.pt`, the zip format of torch 1.6 and later) read into numpy
arrays without torch: what FlagEmbedding saves BGE-M3's `colbert_linear.pt` and
`sparse_linear.pt` as. Only a state dict of tensors is read: the unpickler knows torch's tensor
and storage constructors and nothing else, so a file that would run other code is refused."""

import collections
import io
import pickle
import zipfile
from pathlib import Path

import numpy as np

from engine.loaders.checkpoint import CheckpointError

# torch's storage classes and dtypes (as newer files name them) -> numpy's
_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "BFloat16Storage": "bfloat16",
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "bfloat16": "bfloat16",
}


def read_state_dict(path: Path) -> dict[str, np.ndarray]:
    """The tensors of the `torch.save`d state dict at `path`, by name, as f32 (or integer)
    arrays; CheckpointError naming the file for anything else."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickled = next((n for n in names if n.endswith("/data.pkl")), None)
            if pickled is None:
                raise CheckpointError(f"{path}: not a torch.save zip archive (no data.pkl)")
            root = pickled[: -len("data.pkl")]
            state = _Unpickler(archive, root, path).load()
    except (zipfile.BadZipFile, pickle.UnpicklingError, KeyError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable torch state dict ({e})") from e
    if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
        raise CheckpointError(f"{path}: expected a state dict of tensors")
    return state


class _Unpickler(pickle.Unpickler):
    """A pickle reader of torch's tensors, its storages read from the archive's `data/`."""

    def __init__(self, archive: zipfile.ZipFile, root: str, path: Path):
        super().__init__(io.BytesIO(archive.read(f"{root}data.pkl")))
        self.archive, self.root, self.path = archive, root, path

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return lambda tensor, requires_grad, hooks: tensor
        if module == "torch" and name in _DTYPES:
            return name
        raise pickle.UnpicklingError(f"{self.path}: refusing to load {module}.{name}")

    def persistent_load(self, saved_id) -> np.ndarray:
        """A storage's elements, flat, in their own dtype."""
        kind, dtype, key, _location, _numel = saved_id
        if kind != "storage" or dtype not in _DTYPES:
            raise pickle.UnpicklingError(f"{self.path}: unknown storage {saved_id!r}")
        raw = self.archive.read(f"{self.root}data/{key}")
        if _DTYPES[dtype] == "bfloat16":  # the high half of an f32
            bits = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
            return bits.view(np.float32)
        return np.frombuffer(raw, np.dtype(_DTYPES[dtype]).newbyteorder("<"))


def _rebuild_tensor(storage: np.ndarray, offset: int, size, stride, *_) -> np.ndarray:
    """The tensor of `size` and `stride` (in elements) at `offset` of `storage`, copied."""
    if not size:
        return storage[offset : offset + 1].reshape(()).copy()
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=tuple(size), strides=tuple(s * item for s in stride)
    )
    return np.array(view, dtype=np.float32 if storage.dtype.kind == "f" else storage.dtype)
