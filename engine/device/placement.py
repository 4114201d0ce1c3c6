"""Where the engine's arrays live: the local devices split into groups, one device runner per
group (data parallel), and one group's weights and KV pool laid over its devices (tensor
parallel, JAX's SPMD partitioner doing the rest).

Tensor parallel shards each matrix along one axis of a one-dimensional mesh named "model":
the fused q/k/v and gate/up matrices by output column, the attention output and down
projections by input row, the language-model head by vocabulary row, the KV pool by kv head.
The packed batch, its metadata, the embedding and the norms are replicated. An axis that does
not divide by the group's size is replicated instead: the result is the same, only the memory
saved differs. Attention runs on each device's own heads (`Placement.split_heads`): a kernel is
an opaque call to the partitioner, which would otherwise gather every head to every device and
compute all of them on each.
"""

import functools
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from engine.errors import InvalidInput

AXIS = "model"
# matrix name -> the axis of its [L, K, N] stack that is split
MATRIX_AXES = {"qkv": 2, "gate_up": 2, "o": 1, "down": 1}
POOL_AXIS = 3  # K and V pools are [L, P, page, Hkv, D]


def device_groups(
    data_parallel: int | None, tensor_parallel: int, devices: Sequence | None = None
) -> list[list]:
    """`data_parallel` groups of `tensor_parallel` devices each, in device order (None: as many
    groups as the local devices make); InvalidInput naming the field that does not fit."""
    devices = list(devices if devices is not None else jax.local_devices())
    if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int):
        raise InvalidInput("tensor_parallel", "must be a positive integer")
    if not 1 <= tensor_parallel <= len(devices):
        raise InvalidInput("tensor_parallel", f"must be from 1 to the {len(devices)} local devices")
    groups = len(devices) // tensor_parallel if data_parallel is None else data_parallel
    bad = isinstance(groups, bool) or not isinstance(groups, int) or groups < 1
    if bad or groups * tensor_parallel > len(devices):
        raise InvalidInput(
            "data_parallel",
            f"{groups} runners of {tensor_parallel} devices need {groups * tensor_parallel} "
            f"devices; {len(devices)} are here",
        )
    return [devices[i * tensor_parallel : (i + 1) * tensor_parallel] for i in range(groups)]


class Placement:
    """One runner's devices: a single device, or a "model" mesh over several."""

    def __init__(self, devices: Sequence):
        self.devices = list(devices)
        self.mesh = Mesh(np.array(self.devices), (AXIS,)) if len(self.devices) > 1 else None

    @property
    def size(self) -> int:
        return len(self.devices)

    def default_device(self):
        """A context in which new arrays are made on the group's first device of this
        process."""
        local = [d for d in self.devices if d.process_index == jax.process_index()]
        return jax.default_device(local[0])

    def replicated(self):
        """The sharding of an array every device of the group holds whole."""
        if self.mesh is None:
            return SingleDeviceSharding(self.devices[0])
        return NamedSharding(self.mesh, P())

    def params(self, params: dict) -> dict:
        """`params` (as `engine.models.layout.place_decoder` makes them) committed to the group."""
        if self.mesh is None:
            return jax.device_put(params, self.replicated())
        shardings = {
            **{name: self.replicated() for name in params if name not in ("head", "matrices")},
            "layers": jax.tree.map(lambda _: self.replicated(), params["layers"]),
            "head": self._split(params["head"], 0),
            "matrices": {
                name: self._split(w, MATRIX_AXES[name]) for name, w in params["matrices"].items()
            },
        }
        return put(params, shardings)

    def pool_shardings(self, pool):
        """The shardings of a `score_kernels.paging.LayerPool` (None: no pool)."""
        if pool is None:
            return None
        if self.mesh is None:
            return jax.tree.map(lambda _: self.replicated(), pool)
        k, v, _ = pool
        return type(pool)(self._split(k, POOL_AXIS), self._split(v, POOL_AXIS), self.replicated())

    def split_heads(self, attention: Callable, kv_heads: int) -> Callable:
        """`attention` run by each device of the mesh on its own query and kv heads (its shard of
        the pool's kv heads too), where the group's size divides `kv_heads`: head h reads kv head
        h // G, so a device's contiguous heads read exactly its own kv heads. Elsewhere (one
        device, or kv heads the mesh does not divide, which stay replicated) `attention` as it
        is."""
        if self.mesh is None or kv_heads % self.size:
            return attention
        return functools.partial(_split_heads, attention, self.mesh)

    def _split(self, x, axis: int):
        if not hasattr(x, "shape") or x.shape[axis] % self.size:
            return self.replicated()
        spec = [None] * x.ndim
        spec[axis] = AXIS
        return NamedSharding(self.mesh, P(*spec))


def _split_heads(
    attention: Callable, mesh: Mesh, q, k, v, meta, *, scale: float, softcap=0.0, pool=None
):
    heads = P(None, AXIS, None)  # q [T, H, D], k and v [T, Hkv, D], the output [T, H, D]
    pool_specs = P()
    if pool is not None:
        pages = P(*[AXIS if axis == POOL_AXIS else None for axis in range(pool.k.ndim)])
        pool_specs = type(pool)(pages, pages, P())

    def local(q, k, v, meta, pool):
        return attention(q, k, v, meta, scale=scale, softcap=softcap, pool=pool)

    split = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(heads, heads, heads, P(), pool_specs),
        out_specs=heads,
        check_vma=False,
    )
    return split(q, k, v, meta, pool)


def put(tree, shardings):
    """`jax.device_put(tree, shardings)`, also where a sharding spans other processes' devices
    (a mesh across hosts): each process then places its own shards from its host copy, which
    must be the same on every process."""

    def one(x, sharding):
        if sharding.is_fully_addressable:
            return jax.device_put(x, sharding)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(one, tree, shardings)
