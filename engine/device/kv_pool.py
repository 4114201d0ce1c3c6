"""The KV pool on the device (DESIGN §3b): how many pages of K/V it holds, their arrays, and
losing them to a failed step. Which pages hold which token prefixes is the host's business
(`engine.host.kv_cache`); the forward reads and writes the arrays (`score_kernels.paging`)."""

import jax
import numpy as np

from engine.device.placement import Placement, put
from engine.errors import InvalidInput
from engine.models import ModelConfig
from engine.results import KVPoolInfo
from score_kernels import devices
from score_kernels.paging import LayerPool, empty_pool

DEFAULT_PAGE_SIZE = 16  # tokens per page: the prefix cache's granularity
DEFAULT_POOL_SHARE = 8  # the default pool takes 1/8 of the device's (or host's) memory
DEFAULT_POOL_TOKENS = 1 << 18  # ... and never more than this many tokens need
POOL_FIT = 0.9  # of the memory free at start, the most a pool may take (the rest: activations)


def default_kv_cache_bytes(bytes_per_token: int, memory: int | None = None) -> int:
    """The default pool: `1/DEFAULT_POOL_SHARE` of `memory` (None: the default device's, the
    host's on CPU), capped at what `DEFAULT_POOL_TOKENS` tokens need."""
    if memory is None:
        memory = devices.memory(jax.devices()[0])
    return min(memory // DEFAULT_POOL_SHARE, DEFAULT_POOL_TOKENS * bytes_per_token)


class KVPool:
    """Pages of `page_size` tokens of every layer's K and V, in `dtype`, on `placement`'s
    devices: as many as `kv_cache_bytes` pays for (0: none; None: the default pool divided by
    `share`, the runners whose devices share one memory). A pool that cannot fit in what its
    device has free is refused with InvalidInput naming `kv_cache_bytes`.

    `arrays` is what the forward takes and gives back (None without pages); `recover` zeroes a
    pool a failed step lost, and `resets` counts those losses.
    """

    def __init__(
        self,
        config: ModelConfig,
        dtype,
        placement: Placement,
        *,
        kv_cache_bytes: int | None,
        page_size: int = DEFAULT_PAGE_SIZE,
        share: int = 1,
    ):
        if page_size < 1:
            raise InvalidInput("page_size", f"must be at least 1, got {page_size}")
        self.config, self.dtype, self.placement = config, dtype, placement
        self.page_size = page_size
        self.bytes_per_token = config.kv_bytes_per_token(np.dtype(dtype).itemsize)
        if kv_cache_bytes is None:
            kv_cache_bytes = default_kv_cache_bytes(self.bytes_per_token) // share
        page_bytes = page_size * self.bytes_per_token
        self.num_pages = kv_cache_bytes // page_bytes if kv_cache_bytes > 0 else 0
        self._check_fits(self.num_pages * page_bytes)
        self.arrays: LayerPool | None = self._empty()
        # the pool's shapes and placement, which never change: what a program is compiled for,
        # while a running step may hold (and donate) the arrays themselves
        self.spec = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), self.arrays
        )
        self.resets = 0  # times the pool was lost (a failed step) and zeroed again

    @property
    def tokens(self) -> int:
        """Tokens the pool holds."""
        return self.num_pages * self.page_size

    def info(self, *, prefix_cache: bool) -> KVPoolInfo:
        """The pool's size (`prefix_cache`: whether prefixes are reused across requests)."""
        return KVPoolInfo(
            pages=self.num_pages,
            page_size=self.page_size,
            capacity_tokens=self.tokens,
            bytes=self.tokens * self.bytes_per_token,
            prefix_cache=prefix_cache,
        )

    def shardings(self):
        """Where each array of the pool lives (it keeps its sharding from step to step)."""
        return self.placement.pool_shardings(self.arrays)

    def recover(self) -> bool:
        """After a failed step: zero the pool again if the failure lost it (its buffers were
        donated to the step that failed). True when it did, so every cached page is gone."""
        if self.arrays is None:
            return False
        try:
            if not any(x.is_deleted() for x in self.arrays):
                jax.block_until_ready(self.arrays)
                return False
        except Exception:  # the step's outputs carry its error
            pass
        self.arrays = self._empty()
        self.resets += 1
        return True

    def _check_fits(self, pool_bytes: int) -> None:
        """InvalidInput naming `kv_cache_bytes` when the pool cannot fit in what its device has
        free beside the weights (rather than the allocation failing, or the host's OOM killer
        stopping the process); a pool sharded over devices needs its share on each."""
        if not pool_bytes:
            return
        sharded = self.placement.size > 1
        device = jax.local_devices()[0] if sharded else self.placement.devices[0]
        free, need = devices.free_memory(device), pool_bytes // self.placement.size
        if free is not None and need > free * POOL_FIT:
            gib = lambda n: f"{n / 2**30:.2f} GiB"
            raise InvalidInput(
                "kv_cache_bytes",
                f"a KV pool of {gib(need)} per device does not fit in the {gib(free)} of "
                f"{device.platform} memory free beside the weights: give a smaller "
                "kv_cache_bytes (0: no pool)",
            )

    def _empty(self) -> LayerPool | None:
        if not self.num_pages:
            return None
        c = self.config
        with self.placement.default_device():
            pool = empty_pool(
                c.num_layers, self.num_pages, self.page_size, c.num_kv_heads, c.head_dim, self.dtype
            )
        return put(pool, self.placement.pool_shardings(pool))
