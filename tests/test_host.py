"""Host-side weight preparation, which runs on any CPU: aligned transfers to the device and the
packing of the native dense kernel's weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from score_kernels import cpu, devices
from score_kernels.host import ALIGNMENT, aligned_empty, interleave_to_device, to_device


def _bits(x) -> bytes:
    return np.asarray(x).tobytes()


def _weights(*shape, seed=0) -> np.ndarray:
    """Random floats over many binades, so that bf16 rounding meets ties and subnormals."""
    rng = np.random.default_rng(seed)
    scale = 2.0 ** rng.integers(-130, 100, shape)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("shape", [(3,), (5, 7), (2, 3, 129)])
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.uint16])
def test_aligned_empty(shape, dtype):
    out = aligned_empty(shape, dtype)
    assert out.shape == shape and out.dtype == np.dtype(dtype)
    assert out.flags.c_contiguous
    assert out.ctypes.data % ALIGNMENT == 0


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_to_device_equals_jnp_asarray(dtype):
    w = _weights(64, 48)
    placed = to_device(w, dtype)
    assert placed.dtype == dtype and placed.shape == w.shape
    assert _bits(placed) == _bits(jnp.asarray(w, dtype))


def test_to_device_copies_the_host_array():
    w = np.ones((4, 16), np.float32)
    placed = to_device(w, jnp.float32)
    w[:] = 2.0
    assert np.all(np.asarray(placed) == 1.0)


def test_to_device_keeps_a_device_array_of_that_dtype():
    placed = jnp.ones((4, 4), jnp.bfloat16)
    assert to_device(placed, jnp.bfloat16) is placed
    assert to_device(placed, jnp.float32).dtype == jnp.float32


@pytest.mark.skipif(devices.backend() != "cpu", reason="zero-copy adoption is CPU-only")
def test_the_cpu_device_adopts_the_aligned_buffer():
    host = aligned_empty((8, 32), np.float32)
    host[:] = 1.0
    assert jax.device_put(host).unsafe_buffer_pointer() == host.ctypes.data


def test_interleave_to_device_puts_columns_side_by_side():
    parts = [_weights(2, 8, 5, seed=1), _weights(2, 8, 5, seed=2), _weights(2, 8, 5, seed=3)]
    for dtype in (jnp.bfloat16, jnp.float32):
        want = jnp.asarray(np.stack(parts, axis=-1).reshape(2, 8, 15), dtype)
        got = interleave_to_device(parts, dtype)
        assert got.shape == (2, 8, 15) and _bits(got) == _bits(want)
        assert _bits(got[..., 4]) == _bits(jnp.asarray(parts[1][..., 1], dtype))


# --- packing for the native dense kernel ---------------------------------------------------------


def _pack_reference(w) -> np.ndarray:
    """The packed layout spelled out: bf16, then [..., N/16, K/2, 16, 2] pairs, flattened."""
    w = np.asarray(w).astype(jnp.bfloat16)
    *lead, k, n = w.shape
    w = w.reshape(*lead, k // 2, 2, n // 16, 16)
    w = np.moveaxis(w, (-4, -3, -2, -1), (-3, -1, -4, -2))
    return np.ascontiguousarray(w).reshape(*lead, n // 16, k // 2, 32)


def test_packing_layout():
    w = np.arange(4 * 32, dtype=np.float32).reshape(4, 32)  # small integers: exact in bf16
    packed = cpu.pack_dense(w)
    assert packed.shape == (2, 2, 32) and packed.dtype == jnp.bfloat16
    for g, p, c, j in np.ndindex(2, 2, 16, 2):
        assert packed[g, p, 2 * c + j] == w[2 * p + j, 16 * g + c]


@pytest.mark.parametrize("shape", [(2, 16), (64, 48), (3, 96, 32), (2, 2, 6, 64)])
def test_pack_dense_equals_reference(shape):
    w = _weights(*shape)
    packed = cpu.pack_dense(w)
    assert packed.ctypes.data % ALIGNMENT == 0
    assert packed.dtype == jnp.bfloat16
    assert _bits(packed) == _bits(_pack_reference(w))


def test_pack_dense_of_a_transposed_bf16_device_array():
    """The tied LM head is packed from the device embedding [V, E] seen as [1, E, V]."""
    embed = _weights(48, 64)
    on_device = np.asarray(jnp.asarray(embed, jnp.bfloat16))
    assert _bits(cpu.pack_dense(on_device.T[None])) == _bits(_pack_reference(embed.T[None]))


def test_pack_gated_interleaves_packed_groups():
    gate, up = _weights(3, 64, 48, seed=1), _weights(3, 64, 48, seed=2)
    both = np.stack([_pack_reference(gate), _pack_reference(up)], axis=-3)  # [L, I/16, 2, ...]
    packed = cpu.pack_gated(gate, up)
    assert packed.shape == (3, 6, 32, 32)
    assert _bits(packed) == _bits(both.reshape(packed.shape))
