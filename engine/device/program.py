"""The device program: a model's weights on the device and the jitted forward of one packed
batch. The device runner owns one; the offline scorer drives one the same way."""

import functools
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from engine.capabilities import Ability
from engine.device import sparse
from engine.device.kv_pool import DEFAULT_PAGE_SIZE, KVPool
from engine.device.placement import Placement
from engine.errors import InvalidInput
from engine.host.buckets import DEFAULT_BLOCK_SIZE
from engine.host.packing import empty_batch
from engine.kinds import Output
from engine.loaders import Checkpoint
from engine.models import Dense, ModelConfig, PackedInputs
from score_kernels import devices, select_attention, select_dense
from score_kernels.calibration import Rounding, rounding_by
from score_kernels.dense import Roles
from score_kernels.dense_choice import DenseChoice
from score_kernels.paging import write

# the weight dtype of each compute mode; "int8" keeps bf16 but for the layer matrices, which its
# dense strategies quantise to int8 at load (score_kernels.quant)
DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32, "int8": jnp.bfloat16}


# where `int8_bf16` applies: the kept matrices are multiplied through the measured choice
WITH_INT8 = "keeps matrices in bf16 under dtype int8 with the measured dense choice (dense unset)"


def _selected(dense: str | None, backend: str, dtype: str, cache_dir: str | None) -> Dense:
    """`select_dense` of a `DeviceProgram`'s arguments; InvalidInput naming "dense"."""
    try:
        return select_dense(
            dense, backend, dtype=DTYPES[dtype], int8=dtype == "int8", cache_dir=cache_dir
        )
    except ValueError as e:
        raise InvalidInput("dense", str(e)) from None


def default_compile_cache_dir() -> str:
    return str(Path.home() / ".cache" / "llm-scoring-engine" / "jax")


def enable_compile_cache(directory: str | None) -> None:
    """Keep compiled programs in `directory` (JAX's persistent cache) so that a restart compiles
    nothing; None leaves the cache as it is."""
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", directory)
        # every program, not only slow ones
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


class DeviceProgram:
    """Weights on the device, the paged KV pool (`kv`), and the compiled forward: `run` one packed
    batch to its task's outputs.

    `dtype` is the weight dtype ("bfloat16" or "float32"), or "int8" (bf16, with the layer
    matrices quantised to int8 and multiplied in int8: `score_kernels.quant`); `attention` and
    `dense` name the implementations (None: the backend's default for the batches' attention
    `block_size`; see `score_kernels.select_attention` and `score_kernels.select_dense`). The
    pool holds as many pages of `page_size` tokens as `kv_cache_bytes` pays for (none: no pool,
    and batches may not name context pages; `engine.device.kv_pool`). In float32 every dot runs
    at full f32 precision on every backend. `placement` puts the weights and pool on one device or
    shards them over several (`engine.device.placement`); None is the first local device. Several
    devices need the "xla" dense path (None picks it). The default pool is divided by `share`:
    the runners whose devices share one memory (a CPU's host devices). The measured dense
    strategy keeps its choices under `dense_cache_dir` (None: measured once per process).
    `dense` may also be a strategy itself (`score_kernels.calibration.recording`). In int8,
    `rounding` has the layer matrices rounded by GPTQ (`score_kernels.calibration.Hessians`, or
    their results kept by `engine.rounding_cache`), and
    `int8_bf16` names the layer matrices left in bf16 (`score_kernels.dense.ROLES`).
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        *,
        dtype: str = "bfloat16",
        attention: str | None = None,
        dense: str | Dense | None = None,
        kv_cache_bytes: int | None = 0,
        page_size: int = DEFAULT_PAGE_SIZE,
        block_size: int = DEFAULT_BLOCK_SIZE,
        placement: Placement | None = None,
        share: int = 1,
        dense_cache_dir: str | None = None,
        rounding: Rounding | None = None,
        int8_bf16: tuple[str, ...] = (),
    ):
        if dtype not in DTYPES:
            raise InvalidInput("dtype", f"{dtype!r} is not one of {sorted(DTYPES)}")
        self.config: ModelConfig = checkpoint.config
        self.task = task = checkpoint.task
        self.dtype = dtype
        self.placement = placement or Placement(jax.local_devices()[:1])
        backend = devices.backend()
        sharded = self.placement.size > 1
        if sharded and task.refusal(Ability.TENSOR_PARALLEL):
            raise InvalidInput("tensor_parallel", task.refusal(Ability.TENSOR_PARALLEL))
        if sharded and dtype == "int8":
            raise InvalidInput("dtype", "int8 runs whole on each device: use data_parallel")
        if sharded and dense not in (None, "xla"):
            raise InvalidInput("dense", "tensor parallelism needs the 'xla' dense path")
        dense = "xla" if sharded else dense
        self.dense: Dense = (
            _selected(dense, backend, dtype, cache_dir=dense_cache_dir)
            if dense is None or isinstance(dense, str)
            else dense
        )
        # the rounding prepares the weights only: the forward's strategy does not keep it (nor
        # GPTQ's Hessians) alive
        rounded = self.dense
        if rounding is not None and dtype == "int8":
            rounded = rounding_by(self.dense, rounding)
        placing = self._placing(rounded, int8_bf16, backend, dense_cache_dir)
        try:
            self.attention = select_attention(
                attention,
                backend,
                head_dim=self.config.head_dim,
                dtype=DTYPES[dtype],
                softcap=self.config.attn_softcap,
                block_size=block_size,
                sharded=sharded,
            )
        except ValueError as e:
            raise InvalidInput("attention", str(e)) from None
        with self.placement.default_device():
            params = task.place(checkpoint.params, self.config, DTYPES[dtype], placing)
        self.params = self.placement.params(params)
        self.kv = KVPool(
            self.config,
            DTYPES[dtype],
            self.placement,
            kv_cache_bytes=kv_cache_bytes if task.reuses_kv else 0,
            page_size=page_size,
            share=share,
        )
        # the pool is updated in place, and keeps its sharding from step to step
        outputs = (self.placement.replicated(), self.kv.shardings())
        self._jit = functools.partial(jax.jit, donate_argnums=2, out_shardings=outputs)
        self.output = task.outputs[0]  # the one the grid is compiled for
        # jitted per distinct device output (`Task.device_output`), when first asked for
        self._programs: dict[tuple, Callable] = {}
        self._forward = self._program(self.output)

    def _placing(
        self, dense: Dense, int8_bf16: tuple[str, ...], backend: str, cache_dir
    ) -> Dense | Roles:
        """What prepares the weights: `dense` (the program's strategy, rounding as it is told),
        or in int8 with matrices kept in bf16 (`int8_bf16`: `score_kernels.dense.ROLES`)
        `dense` for the rest and the bf16 mode's strategy for those, which the int8 mode's
        measured choice multiplies as they are."""
        if not int8_bf16:
            return dense
        if self.dtype != "int8" or self.dense.choice is None:
            raise InvalidInput("int8_bf16", WITH_INT8)
        kept = _selected(None, backend, "bfloat16", cache_dir)
        return Roles(dense, kept, frozenset(int8_bf16))

    def forward_of(self, attention, *, output: Output | None = None) -> Callable:
        """This program's forward with `attention` (`Task.forward_of`) answering `output` (by
        default the task's first): its weights' layout and dense path, writing K/V to the pool,
        exact in float32."""
        exact = self.dtype == "float32"
        attention = self.placement.split_heads(attention, self.config.num_kv_heads)
        return self.task.forward_of(
            attention, self.dense, output=output, write_kv=write, exact=exact
        )

    def _program(self, output: Output) -> Callable:
        key = self.task.device_output(output)
        if key not in self._programs:
            self._programs[key] = self._jit(self.forward_of(self.attention, output=output))
        return self._programs[key]

    def shape_key(self, shape: tuple[int, int, int], output: Output) -> tuple:
        """What tells one compiled program from another: the batch shape, and the output's
        program where it is not the grid's."""
        same = self.task.device_output(output) == self.task.device_output(self.output)
        return shape if same else (*shape, self.task.device_output(output))

    @property
    def dense_choice(self) -> DenseChoice | None:
        """What the measured dense strategy chose for each weight shape (None for a forced
        strategy)."""
        return self.dense.choice.report() if self.dense.choice is not None else None

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights on the device (a tied head that is the embedding counted once)."""
        buffers = {
            shard.data.unsafe_buffer_pointer(): shard.data.nbytes
            for x in jax.tree.leaves(self.params)
            for shard in x.addressable_shards
        }
        return sum(buffers.values())

    def compile(self, shape: tuple[int, int, int], block_size: int) -> None:
        """Compile the program of batch shape (T, S, L), without context, without running it
        (another output's program is compiled when first run)."""
        batch = empty_batch(*shape, block_size, self.config.window)
        self._forward.lower(self.params, batch, self.kv.spec).compile()

    def run(self, batch: PackedInputs, output: Output | None = None) -> jax.Array:
        """Dispatch one packed batch answering `output` (by default the task's first); its
        outputs f32[S, L] (a per-token output's f32[T, E]) are computed asynchronously.

        The batch writes its K/V into the pool at `batch.cache_slots` and reads its context
        region from it. After a failure call `kv.recover`.
        """
        output = output or self.output
        outputs, self.kv.arrays = self._program(output)(self.params, batch, self.kv.arrays)
        if output is Output.SPARSE:  # its fetch reads the real rows alone
            return sparse.Pending(outputs, int(batch.row_count))
        return outputs

    @staticmethod
    def fetch(outputs, output: Output) -> np.ndarray | sparse.SparseRows:
        """The outputs of `run` on the host, once computed: f32[S, L] (f32[T, E]), or of a
        sparse output each row's non-zero entries alone (`engine.device.sparse`)."""
        if output is Output.SPARSE:
            return sparse.fetch(outputs)
        if output is Output.HYBRID:  # (f32[S, E], f32[T], f32[T, D])
            return tuple(np.asarray(part) for part in outputs)
        return np.asarray(outputs)
