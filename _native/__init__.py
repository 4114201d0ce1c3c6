"""Host hot paths: compiled Cython modules with pure-Python twins of the same signature.

The compiled module is used when it was built; otherwise the twin is, and `COMPILED` says which.
"""

from . import _buckets_py

try:
    from . import _buckets as _buckets_native
except ImportError:  # not built (e.g. a source checkout without `pip install -e .`)
    _buckets_native = None

COMPILED = _buckets_native is not None
IMPLEMENTATIONS = {"python": _buckets_py, **({"native": _buckets_native} if COMPILED else {})}
pick_bucket = (_buckets_native or _buckets_py).pick_bucket

__all__ = ["COMPILED", "IMPLEMENTATIONS", "pick_bucket"]
