"""Builds the Cython hot paths in `_native/`; everything else is declared in pyproject.toml."""

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension("_native._buckets", ["_native/_buckets.pyx"], include_dirs=[numpy.get_include()]),
]

setup(ext_modules=cythonize(extensions, language_level=3))
