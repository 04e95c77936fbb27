"""Builds benchmarks/_noop.pyx in place (needs Cython, as the package build does)."""

from __future__ import annotations

import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load_noop_core() -> type:
    """The compiled ``NoopCore`` class, building it first when needed."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    try:
        return importlib.import_module("_noop").NoopCore  # type: ignore[no-any-return]
    except ImportError:
        pass
    from Cython.Build import cythonize
    from setuptools import Extension
    from setuptools.dist import Distribution

    extension = Extension("_noop", [os.path.join(HERE, "_noop.pyx")])
    dist = Distribution({"ext_modules": cythonize([extension], language_level=3, quiet=True)})
    command = dist.get_command_obj("build_ext")
    command.inplace = True
    command.build_lib = HERE
    cwd = os.getcwd()
    os.chdir(HERE)
    try:
        dist.run_command("build_ext")
    finally:
        os.chdir(cwd)
    importlib.invalidate_caches()
    return importlib.import_module("_noop").NoopCore  # type: ignore[no-any-return]


if __name__ == "__main__":
    print(load_noop_core())
