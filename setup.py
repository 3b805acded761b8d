"""Builds the StarPU shim (cffi API mode) at install time; metadata is in pyproject.toml."""

from setuptools import setup

setup(cffi_modules=["src/torch_nntile/runtime/_build_shim.py:ffibuilder"])
