"""Builds the native hot paths in `_native/`; everything else is declared in pyproject.toml.

The Cython modules are plain C. `_cpu` is C++ (the CPU attention and dense custom calls) and
compiles against the XLA FFI headers that jaxlib ships.
"""

import os

import jaxlib
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

MODULES = ("_buckets", "_pack", "_prefix_cache", "_radix")

extensions = [
    Extension(f"_native.{name}", [f"_native/{name}.pyx"], include_dirs=[numpy.get_include()])
    for name in MODULES
]
extensions.append(
    Extension(
        "_native._cpu",
        ["_native/_cpu.pyx", "_native/attention.cc", "_native/dense.cc", "_native/dense_int8.cc"],
        include_dirs=["_native", os.path.join(os.path.dirname(jaxlib.__file__), "include")],
        language="c++",
        extra_compile_args=["-O3", "-std=c++17", "-fno-math-errno", "-Wno-psabi"],
        depends=[
            "_native/attention.h",
            "_native/attention_kernel.h",
            "_native/cpu_pool.h",
            "_native/dense.h",
            "_native/dense_int8.h",
            "_native/dense_int8_kernel.h",
            "_native/dense_tiles.h",
        ],
    )
)

setup(ext_modules=cythonize(extensions, language_level=3))
