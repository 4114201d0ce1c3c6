"""Builds the Cython hot paths in `_native/`; everything else is declared in pyproject.toml."""

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

MODULES = ("_buckets", "_pack", "_radix")

extensions = [
    Extension(f"_native.{name}", [f"_native/{name}.pyx"], include_dirs=[numpy.get_include()])
    for name in MODULES
]

setup(ext_modules=cythonize(extensions, language_level=3))
