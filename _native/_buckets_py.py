"""Padding-bucket selection in pure Python. Twin of `_native/_buckets.pyx`."""

from bisect import bisect_left
from collections.abc import Sequence


def pick_bucket(buckets: Sequence[int], n: int) -> int:
    """Smallest bucket >= n from the ascending sequence `buckets`; ValueError when none fits."""
    i = bisect_left(buckets, n)
    if i == len(buckets):
        largest = buckets[-1] if buckets else None
        raise ValueError(f"size {n} exceeds the largest bucket {largest}")
    return buckets[i]
