"""Builds the native hot paths in `_native/`; everything else is declared in pyproject.toml.

The Cython modules are plain C. `_cpu` is C++ (the CPU attention and dense custom calls) and
compiles against the XLA FFI headers that jaxlib ships. `_onednn` (oneDNN's matmul as a custom
call) also needs oneDNN's headers and library, from the `onednn-devel-cpu-gomp` and
`onednn-cpu-gomp` packages; without them it is left out and the engine runs without it.
"""

import os
from importlib import metadata

import jaxlib
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

MODULES = ("_buckets", "_join", "_pack", "_prefix_cache")
# Cython over the C++ standard library, each with the header it wraps, if any
CPP_MODULES = {"_prefix_groups": ["_native/prefix_groups.h"], "_schedule": []}

extensions = [
    Extension(f"_native.{name}", [f"_native/{name}.pyx"], include_dirs=[numpy.get_include()])
    for name in MODULES
]
extensions += [
    Extension(
        f"_native.{name}",
        [f"_native/{name}.pyx"],
        include_dirs=["_native", numpy.get_include()],
        language="c++",
        extra_compile_args=["-O3", "-std=c++17"],
        depends=headers,
    )
    for name, headers in CPP_MODULES.items()
]
extensions.append(
    Extension(
        "_native._cpu",
        [
            "_native/_cpu.pyx",
            "_native/attention.cc",
            "_native/dense.cc",
            "_native/dense_int8.cc",
            "_native/dense_f32.cc",
        ],
        include_dirs=["_native", os.path.join(os.path.dirname(jaxlib.__file__), "include")],
        language="c++",
        extra_compile_args=["-O3", "-std=c++17", "-fno-math-errno", "-Wno-psabi"],
        depends=[
            "_native/amx.h",
            "_native/attention.h",
            "_native/attention_kernel.h",
            "_native/attention_amx.h",
            "_native/builds.h",
            "_native/cpu_pool.h",
            "_native/dense.h",
            "_native/dense_amx.h",
            "_native/dense_f32.h",
            "_native/dense_f32_kernel.h",
            "_native/dense_forms.h",
            "_native/dense_int8.h",
            "_native/dense_int8_amx.h",
            "_native/dense_int8_kernel.h",
            "_native/dense_staged.h",
            "_native/dense_tiles.h",
            "_native/simd.h",
        ],
    )
)
extensions.append(
    Extension(
        "_native._byte_bpe",
        ["_native/_byte_bpe.pyx", "_native/byte_bpe.cc"],
        include_dirs=["_native", numpy.get_include()],
        language="c++",
        extra_compile_args=["-O3", "-std=c++17"],
        depends=["_native/byte_bpe.h"],
    )
)


def onednn_dirs() -> tuple[str, str] | None:
    """oneDNN's include and library directories, from its packages' installed files."""
    try:
        files = {
            name: metadata.distribution(name).files or []
            for name in ("onednn-devel-cpu-gomp", "onednn-cpu-gomp")
        }
    except metadata.PackageNotFoundError:
        return None
    headers = [f for f in files["onednn-devel-cpu-gomp"] if str(f).endswith("dnnl/dnnl.hpp")]
    libraries = [f for f in files["onednn-cpu-gomp"] if f.name == "libdnnl.so"]
    if not headers or not libraries:
        return None
    header = metadata.distribution("onednn-devel-cpu-gomp").locate_file(headers[0])
    library = metadata.distribution("onednn-cpu-gomp").locate_file(libraries[0])
    return str(header.parents[2]), str(library.parent)  # include/oneapi/dnnl/dnnl.hpp


if (found := onednn_dirs()) is not None:
    include, lib = found
    extensions.append(
        Extension(
            "_native._onednn",
            ["_native/_onednn.pyx", "_native/dense_onednn.cc"],
            include_dirs=[
                "_native",
                include,
                numpy.get_include(),
                os.path.join(os.path.dirname(jaxlib.__file__), "include"),
            ],
            library_dirs=[lib],
            libraries=[":libdnnl.so.3"],
            language="c++",
            extra_compile_args=["-O2", "-std=c++17"],
            depends=["_native/builds.h", "_native/dense_onednn.h"],
        )
    )

setup(ext_modules=cythonize(extensions, language_level=3))
