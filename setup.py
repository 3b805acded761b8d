"""Builds the StarPU shim (cffi API mode), the structure key of compiles
(``tiling/csrc/structure.c``) and the graph's reference counts (``graph/csrc/refs.c``),
both needing only Python's headers, and, where torch is
importable at build time, the backend's C++ library: the view kernels
(``backend/csrc/views.cpp``), the device guard (``backend/csrc/device_guard.cpp``)
and the device hooks (``backend/csrc/hooks.cpp``);
metadata is in pyproject.toml.

That library is optional: a build without torch (the wheel's tools venv) leaves it
out, and the package then registers the same view kernels in Python and keeps the
device guard PyTorch gives a Python backend.

The two C modules use Python's limited API: without that library the wheel is tagged
``cp311-abi3`` and installs on every CPython from 3.11 on (the GPU machine has 3.12).

``TORCH_NNTILE_CUDA=1`` (``make wheel-cuda``) marks a build against StarPU with CUDA
workers: version ``+cu130`` (a local version, as torch's) and the NVIDIA wheels whose
libraries that StarPU loads as dependencies. Version and dependencies are therefore
dynamic (pyproject.toml) and set here."""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup

VERSION = "0.1.0"
DEPENDENCIES = ["torch>=2.13.0,<2.14", "cffi>=1.15"]
CUDA_TAG = "cu130"  # CUDA 13.0, as scripts/build_starpu.sh's STARPU_CUDA=1 build
CUDA_DEPENDENCIES = ["nvidia-cuda-runtime==13.*", "nvidia-cublas==13.*"]


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
LIMITED_API = {"py_limited_api": True, "define_macros": [("Py_LIMITED_API", "0x030B0000")],  # 3.11's stable ABI
               # libc needed outright: auditwheel tells a wheel's libc from its extensions' needed
               # libraries, and fails on a module that needs none ("couldn't detect libc")
               "extra_link_args": ["-Wl,--no-as-needed", "-lc"] if sys.platform.startswith("linux") else []}
STRUCTURE = Extension("torch_nntile.tiling._structure", sources=["src/torch_nntile/tiling/csrc/structure.c"],
                      extra_compile_args=PY_C_ARGS, **LIMITED_API)
REFS = Extension("torch_nntile.graph._refs", sources=["src/torch_nntile/graph/csrc/refs.c"], extra_compile_args=PY_C_ARGS,
                 **LIMITED_API)

cuda = os.environ.get("TORCH_NNTILE_CUDA") == "1"
native = _backend_library()
setup(version=f"{VERSION}+{CUDA_TAG}" if cuda else VERSION,
      install_requires=DEPENDENCIES + (CUDA_DEPENDENCIES if cuda else []),
      cffi_modules=["src/torch_nntile/runtime/_build_shim.py:ffibuilder"],
      ext_modules=[STRUCTURE, REFS, *native],
      # the C++ library is built for one Python version: only a build without it is abi3
      options={} if native else {"bdist_wheel": {"py_limited_api": "cp311"}})
