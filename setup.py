"""Builds the compiled core ``turbospark.recording._recorder``, the expert-cache kernels
``turbospark.offload._cache_kernels`` and the trace-metric sums ``turbospark.metrics._metrics_kernels``
from ``csrc/``; metadata lives in pyproject.toml."""

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

# The one place compiler directives are set: a ``# cython:`` header in the
# .pyx would silently override these.
DIRECTIVES = {
    "language_level": 3,
    "boundscheck": False,
    "wraparound": False,
    "cdivision": True,
    "initializedcheck": False,
    "embedsignature": True,
}

extensions = [
    Extension(
        "turbospark.recording._recorder",
        ["csrc/_recorder.pyx"],
        include_dirs=[numpy.get_include(), "csrc"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    ),
    Extension(
        "turbospark.offload._cache_kernels",
        ["csrc/_cache.pyx"],
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    ),
    Extension(
        "turbospark.metrics._metrics_kernels",
        ["csrc/_metrics.pyx"],
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    ),
]

setup(ext_modules=cythonize(extensions, compiler_directives=DIRECTIVES))
