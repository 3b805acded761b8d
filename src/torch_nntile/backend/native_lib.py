"""The backend's optional C++ library (``backend/csrc``): where it is, and whether it
may be loaded into this torch."""

from __future__ import annotations

import functools
import mmap
import os
import warnings

import torch

_BUILT_AGAINST = b"torch_nntile: built against torch "  # csrc/hooks.cpp's marker, then the version and a NUL


@functools.cache
def native_library() -> str | None:
    """The backend's C++ library beside this module, or None where it was not built (a
    build without torch, such as the wheel's) or was built against another torch release
    (a tree built in one environment, imported in another): C++ code compiled against
    one torch fails to load into another, or loads and misreads its changed classes.
    The package then runs the same kernels in Python, and warns."""
    here = os.path.dirname(os.path.abspath(__file__))  # backend/
    path = next((os.path.join(here, f) for f in sorted(os.listdir(here)) if f.startswith("_native.") and f.endswith(".so")),
                None)
    return path if path is not None and _loadable(path) else None


def _loadable(path: str) -> bool:
    """False, with a warning, for a build of the C++ library recorded against another torch."""
    built = built_against(path)
    if built is None or built == torch.__version__.split("+")[0]:
        return True
    warnings.warn(f"torch_nntile: {path} was built against torch {built}, not this torch {torch.__version__}; "
                  "running without it (rebuild the package to use it)", RuntimeWarning, stacklevel=3)
    return False


def built_against(path: str) -> str | None:
    """The torch version (``2.13.0``) a build of the C++ library was compiled against,
    read from its file without loading it; None for a build older than that record."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        start = m.find(_BUILT_AGAINST)
        if start < 0:
            return None
        start += len(_BUILT_AGAINST)
        return m[start:m.find(b"\0", start)].decode()
