"""The NVIDIA libraries of the CUDA build, found before the StarPU shim is imported.

The CUDA wheel (``torch_nntile-*+cu130``) does not carry CUDA: its libstarpu needs
``libcudart``, ``libcublas`` and ``libcublasLt`` from NVIDIA's wheels
(``nvidia-cuda-runtime``, ``nvidia-cublas``), and finds them through its RPATH where
pip puts them beside this package (``site-packages/nvidia/cu13/lib``). Where they are
elsewhere on ``sys.path`` (another site-packages, a ``--target`` folder), ``import_shim``
loads them from there by full path first, so that the dynamic loader then finds them
by name; where they are nowhere, the import fails with the fix instead of a loader
message. A build without CUDA imports the shim at the first try and never looks.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
from types import ModuleType

SHIM = "torch_nntile.runtime._shim"
# In loading order: cuBLAS needs cuBLASLt, and both the runtime.
LIBRARIES = ("libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13")
WHEEL_DIR = os.path.join("nvidia", "cu13", "lib")  # where NVIDIA's CUDA 13 wheels put them
FIX = 'pip install "nvidia-cuda-runtime==13.*" "nvidia-cublas==13.*"'


def missing_library(err: BaseException) -> str | None:
    """The CUDA library an import error is about (the loader names the soname), or None."""
    text = str(err)
    return next((lib for lib in LIBRARIES if lib in text), None)


def search_dirs() -> list[str]:
    """The ``nvidia/cu13/lib`` folders of the ``nvidia`` namespace package: one per
    ``sys.path`` entry that has it, in ``sys.path``'s order."""
    found = []
    for entry in sys.path:
        d = os.path.join(entry or os.getcwd(), WHEEL_DIR)
        if os.path.isdir(d) and d not in found:
            found.append(d)
    return found


def error(lib: str, detail: str) -> ImportError:
    """The error a user sees, with what to install."""
    return ImportError(
        f"torch_nntile: this is the CUDA build, and its StarPU needs {lib} (NVIDIA's CUDA 13 wheels), "
        f"which could not be loaded: {detail}. Install them with: {FIX} "
        "(or install the CPU wheel of torch_nntile instead)")


def _load(path: str) -> None:
    """Load one library for the whole process (RTLD_GLOBAL): later lookups by soname find it."""
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def preload(libraries: tuple[str, ...] = LIBRARIES) -> None:
    """Load each library from the first ``search_dirs()`` folder that has it.

    Raises:
        ImportError: naming the first library that is not there or does not load, and the fix.
    """
    dirs = search_dirs()
    for lib in libraries:
        path = next((p for p in (os.path.join(d, lib) for d in dirs) if os.path.exists(p)), None)
        if path is None:
            where = ", ".join(dirs) if dirs else f"no {WHEEL_DIR} folder on sys.path"
            raise error(lib, f"not found ({where})")
        try:
            _load(path)
        except OSError as e:
            raise error(lib, str(e)) from e


def import_shim(name: str = SHIM) -> ModuleType:
    """``import torch_nntile.runtime._shim``, with the CUDA libraries looked for where the
    first try fails for want of one of them.

    Raises:
        ImportError: the CUDA libraries cannot be loaded (the message says what to install),
            or the import failed for another reason (that error, unchanged).
    """
    try:
        return importlib.import_module(name)
    except (ImportError, OSError) as e:
        if missing_library(e) is None:
            raise
    preload()
    try:
        return importlib.import_module(name)
    except (ImportError, OSError) as e:
        lib = missing_library(e)
        if lib is None:
            raise
        raise error(lib, str(e)) from e
