"""The device program's KV pool: refused at start, naming `kv_cache_bytes`, when it cannot fit in
the memory its device has free (never left to the allocator or the OOM killer)."""

import jax
import pytest

from engine import DeviceProgram, InvalidInput, load_checkpoint
from score_kernels import devices

MIB = 2**20


@pytest.fixture(scope="module")
def checkpoint(tiny_path):
    return load_checkpoint(tiny_path, progress=False)


def test_the_host_reports_its_free_memory():
    free = devices.free_memory(jax.devices("cpu")[0])
    assert free is not None and 0 < free <= 2**50


def test_a_pool_that_cannot_fit_is_refused_naming_kv_cache_bytes(checkpoint, monkeypatch):
    monkeypatch.setattr(devices, "free_memory", lambda device: 4 * MIB)
    with pytest.raises(InvalidInput, match=r"^kv_cache_bytes: a KV pool of 4\.00 GiB"):
        DeviceProgram(checkpoint, dtype="float32", kv_cache_bytes=4 * 2**30)
    with pytest.raises(InvalidInput, match=r"^kv_cache_bytes: .* free beside the weights"):
        DeviceProgram(checkpoint, dtype="float32", kv_cache_bytes=4 * MIB)  # over 90% of it
    program = DeviceProgram(checkpoint, dtype="float32", kv_cache_bytes=2 * MIB)
    assert program.kv.num_pages * program.kv.page_size * program.kv.bytes_per_token == 2 * MIB
    assert DeviceProgram(checkpoint, dtype="float32", kv_cache_bytes=0).kv.num_pages == 0


def test_unknown_free_memory_refuses_nothing(checkpoint, monkeypatch):
    monkeypatch.setattr(devices, "free_memory", lambda device: None)
    assert DeviceProgram(checkpoint, dtype="float32", kv_cache_bytes=2 * MIB).kv.num_pages > 0


def test_a_cpu_device_holds_the_hosts_memory():
    cpu = jax.devices("cpu")[0]
    assert devices.memory(cpu) == devices.host_memory() > devices.free_memory(cpu) > 0
