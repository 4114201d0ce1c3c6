"""Padding-bucket selection, compiled. Twin of `_native/_buckets_py.py`."""


def pick_bucket(buckets, Py_ssize_t n):
    """Smallest bucket >= n from the ascending sequence `buckets`; ValueError when none fits."""
    cdef Py_ssize_t lo = 0, hi = len(buckets), mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if buckets[mid] < n:
            lo = mid + 1
        else:
            hi = mid
    if lo == len(buckets):
        largest = buckets[len(buckets) - 1] if len(buckets) else None
        raise ValueError(f"size {n} exceeds the largest bucket {largest}")
    return buckets[lo]
