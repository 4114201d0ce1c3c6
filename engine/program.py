"""The device program: a model's weights on the device and the jitted forward of one packed
batch. The device runner owns one; the offline scorer drives one the same way."""

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from engine.errors import InvalidInput
from engine.loaders import Checkpoint
from engine.models import Dense, ModelConfig, PackedInputs
from engine.packing import empty_batch
from engine.placement import Placement, put
from engine.results import KVPoolInfo
from kernels import devices, select_attention, select_dense
from kernels.dense_choice import DenseChoice
from kernels.paging import LayerPool, empty_pool, write

# the weight dtype of each compute mode; "int8" keeps bf16 but for the layer matrices, which its
# dense strategies quantise to int8 at load (kernels.quant)
DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32, "int8": jnp.bfloat16}
DEFAULT_PAGE_SIZE = 16  # tokens per KV pool page: the prefix cache's granularity
DEFAULT_POOL_SHARE = 8  # the default pool takes 1/8 of the device's (or host's) memory
DEFAULT_POOL_TOKENS = 1 << 18  # ... and never more than this many tokens need
POOL_FIT = 0.9  # of the memory free at start, the most a pool may take (the rest: activations)


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


def default_kv_cache_bytes(bytes_per_token: int) -> int:
    """The default KV pool: `1/DEFAULT_POOL_SHARE` of the default device's memory (the host's
    on CPU), capped at what `DEFAULT_POOL_TOKENS` tokens need."""
    stats = jax.devices()[0].memory_stats() or {}
    memory = stats.get("bytes_limit") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(memory // DEFAULT_POOL_SHARE, DEFAULT_POOL_TOKENS * bytes_per_token)


class DeviceProgram:
    """Weights on the device, the paged KV pool, and the compiled forward: `run` one packed batch
    to label log-probs.

    `dtype` is the weight dtype ("bfloat16" or "float32"), or "int8" (bf16, with the layer
    matrices quantised to int8 and multiplied in int8: `kernels.quant`); `attention` and `dense`
    name the implementations (None: the backend's default; see `kernels.select_attention` and
    `kernels.select_dense`). The pool holds as many pages of `page_size` tokens as
    `kv_cache_bytes` pays for (none: no pool, and batches may not name context pages).
    `placement` puts the weights and pool on one device or shards them over several
    (`engine.placement`); None is the first local device. Several devices need the "xla" dense
    path (None picks it). The default pool is divided by `share`: the runners whose devices
    share one memory (a CPU's host devices). The measured dense strategy keeps its choices
    under `dense_cache_dir` (None: measured once per process).
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        *,
        dtype: str = "bfloat16",
        attention: str | None = None,
        dense: str | None = None,
        kv_cache_bytes: int | None = 0,
        page_size: int = DEFAULT_PAGE_SIZE,
        placement: Placement | None = None,
        share: int = 1,
        dense_cache_dir: str | None = None,
    ):
        if dtype not in DTYPES:
            raise InvalidInput("dtype", f"{dtype!r} is not one of {sorted(DTYPES)}")
        self.config: ModelConfig = checkpoint.config
        self.task = task = checkpoint.task
        self.dtype = dtype
        self.placement = placement or Placement(jax.local_devices()[:1])
        backend = devices.backend()
        sharded = self.placement.size > 1
        if sharded and task.unshardable():
            raise InvalidInput("tensor_parallel", task.unshardable())
        if sharded and dtype == "int8":
            raise InvalidInput("dtype", "int8 runs whole on each device: use data_parallel")
        if sharded and dense not in (None, "xla"):
            raise InvalidInput("dense", "tensor parallelism needs the 'xla' dense path")
        dense = "xla" if sharded else dense
        try:
            self.dense: Dense = select_dense(
                dense,
                backend,
                dtype=DTYPES[dtype],
                int8=dtype == "int8",
                cache_dir=dense_cache_dir,
            )
        except ValueError as e:
            raise InvalidInput("dense", str(e)) from None
        self.attention = select_attention(
            attention,
            backend,
            head_dim=self.config.head_dim,
            dtype=DTYPES[dtype],
            softcap=self.config.attn_softcap,
        )
        with self.placement.default_device():
            params = task.place(checkpoint.params, self.config, DTYPES[dtype], self.dense)
        self.params = self.placement.params(params)
        forward = task.forward_of(self.attention, self.dense, write_kv=write)
        if page_size < 1:
            raise InvalidInput("page_size", f"must be at least 1, got {page_size}")
        self.page_size = page_size
        if not task.reuses_kv:
            kv_cache_bytes = 0
        if kv_cache_bytes is None:  # runners that `share` one memory divide the default
            kv_cache_bytes = default_kv_cache_bytes(self.kv_bytes_per_token) // share
        page_bytes = page_size * self.kv_bytes_per_token
        self.num_pages = kv_cache_bytes // page_bytes if kv_cache_bytes > 0 else 0
        self._check_pool_fits(self.num_pages * page_bytes)
        self.pool: LayerPool | None = self._empty_pool()
        self.pool_resets = 0  # times the pool was lost (a failed step) and zeroed again
        # the pool is updated in place, and keeps its sharding from step to step
        outputs = (self.placement.replicated(), self.placement.pool_shardings(self.pool))
        self._forward = jax.jit(forward, donate_argnums=2, out_shardings=outputs)

    def _check_pool_fits(self, pool_bytes: int) -> None:
        """InvalidInput naming `kv_cache_bytes` when the pool cannot fit in what its device has
        free beside the weights (rather than the allocation failing, or the host's OOM killer
        stopping the process); a pool sharded over devices needs its share on each."""
        if not pool_bytes:
            return
        device = jax.local_devices()[0] if self.placement.size > 1 else self.placement.devices[0]
        free, need = devices.free_memory(device), pool_bytes // self.placement.size
        if free is not None and need > free * POOL_FIT:
            gib = lambda n: f"{n / 2**30:.2f} GiB"
            raise InvalidInput(
                "kv_cache_bytes",
                f"a KV pool of {gib(need)} per device does not fit in the {gib(free)} of "
                f"{device.platform} memory free beside the weights: give a smaller "
                "kv_cache_bytes (0: no pool)",
            )

    @property
    def dense_choice(self) -> DenseChoice | None:
        """What the measured dense strategy chose for each weight shape (None for a forced
        strategy)."""
        return self.dense.choice.report() if self.dense.choice is not None else None

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token costs in this program's dtype."""
        return self.config.kv_bytes_per_token(np.dtype(DTYPES[self.dtype]).itemsize)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights on the device (a tied head that is the embedding counted once)."""
        buffers = {
            shard.data.unsafe_buffer_pointer(): shard.data.nbytes
            for x in jax.tree.leaves(self.params)
            for shard in x.addressable_shards
        }
        return sum(buffers.values())

    @property
    def pool_tokens(self) -> int:
        """Tokens the KV pool holds."""
        return self.num_pages * self.page_size

    def pool_info(self, *, prefix_cache: bool) -> KVPoolInfo:
        """The KV pool's size (`prefix_cache`: whether prefixes are reused across requests)."""
        return KVPoolInfo(
            pages=self.num_pages,
            page_size=self.page_size,
            capacity_tokens=self.pool_tokens,
            bytes=self.pool_tokens * self.kv_bytes_per_token,
            prefix_cache=prefix_cache,
        )

    def compile(self, shape: tuple[int, int, int], block_size: int) -> None:
        """Compile the program of batch shape (T, S, L), without context, without running it."""
        batch = empty_batch(*shape, block_size, self.config.window)
        self._forward.lower(self.params, batch, self.pool).compile()

    def run(self, batch: PackedInputs) -> jax.Array:
        """Dispatch one packed batch; its label log-probs f32[S, L] are computed asynchronously.

        The batch writes its K/V into the pool at `batch.cache_slots` and reads its context
        region from it. After a failure call `recover`.
        """
        logprobs, self.pool = self._forward(self.params, batch, self.pool)
        return logprobs

    def recover(self) -> bool:
        """After a failed `run`: zero the pool again if the failure lost it (its buffers were
        donated to the step that failed). True when it did, so every cached page is gone."""
        if self.pool is None:
            return False
        try:
            if not any(x.is_deleted() for x in self.pool):
                jax.block_until_ready(self.pool)
                return False
        except Exception:  # the step's outputs carry its error
            pass
        self.pool = self._empty_pool()
        self.pool_resets += 1
        return True

    def _empty_pool(self) -> LayerPool | None:
        if not self.num_pages:
            return None
        c = self.config
        dtype = DTYPES[self.dtype]
        with self.placement.default_device():
            pool = empty_pool(
                c.num_layers, self.num_pages, self.page_size, c.num_kv_heads, c.head_dim, dtype
            )
        return put(pool, self.placement.pool_shardings(pool))
