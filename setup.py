"""Builds the StarPU shim (cffi API mode), the structure key of compiles
(``tiling/csrc/structure.c``) and the graph's reference counts (``graph/csrc/refs.c``),
both needing only Python's headers, and, where torch is
importable at build time, the backend's C++ library: the view kernels
(``backend/csrc/views.cpp``), the device guard (``backend/csrc/device_guard.cpp``)
and the device hooks (``backend/csrc/hooks.cpp``);
metadata is in pyproject.toml.

That library is optional: a build without torch (the wheel's tools venv) leaves it
out, and the package then registers the same view kernels in Python and keeps the
device guard PyTorch gives a Python backend."""

from __future__ import annotations

from setuptools import Extension, setup


def _backend_library() -> list[Extension]:
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return []
    return [Extension(
        "torch_nntile.backend._native",
        sources=["src/torch_nntile/backend/csrc/views.cpp", "src/torch_nntile/backend/csrc/device_guard.cpp",
                 "src/torch_nntile/backend/csrc/hooks.cpp", "src/torch_nntile/backend/csrc/aten_calls.cpp"],
        include_dirs=cpp_extension.include_paths(),
        library_dirs=cpp_extension.library_paths(),
        libraries=["c10", "torch_cpu"],
        language="c++",
        extra_compile_args=["-std=c++20", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"],
    )]


PY_C_ARGS = ["-O2", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"]  # C modules over Python's API alone
STRUCTURE = Extension("torch_nntile.tiling._structure", sources=["src/torch_nntile/tiling/csrc/structure.c"],
                      extra_compile_args=PY_C_ARGS)
REFS = Extension("torch_nntile.graph._refs", sources=["src/torch_nntile/graph/csrc/refs.c"], extra_compile_args=PY_C_ARGS)

setup(cffi_modules=["src/torch_nntile/runtime/_build_shim.py:ffibuilder"],
      ext_modules=[STRUCTURE, REFS, *_backend_library()])
