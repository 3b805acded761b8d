"""cffi (API mode) build script for the StarPU shim.

Every StarPU struct stays in C (``csrc/shim.c`` and the files beside it, with the tile kernels of ``ew.c``,
``rows.c``, ``nn.c``, ``typed.c`` and ``gemm.c``, CUDA workers' in ``cuda.c``); Python sees the plain functions
``csrc/shim.h`` lists.
Built at install time against whichever of ``starpu-1.4`` / ``starpu-1.3``
pkg-config finds, with StarPU-MPI where ``starpumpi-1.4`` and OpenMPI's ``mpicc`` are
there (``TNT_MPI``).
"""

from __future__ import annotations

import os
import shlex
import subprocess

from cffi import FFI

_CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")


def _cdef() -> str:
    """The declarations cffi exposes, all taken from shim.h: the callbacks into Python
    (each made ``extern "Python+C"``), then the functions between its cdef marks."""
    with open(os.path.join(_CSRC, "shim.h")) as f:
        header = f.read()

    def between(mark: str) -> str:
        return header.split(f"/* {mark} begin */", 1)[1].split(f"/* {mark} end */", 1)[0]

    callbacks = "".join(f'extern "Python+C" {line}\n' for line in between("callbacks").split("\n") if line)
    return callbacks + between("cdef")


_SYSTEM_LIBDIRS = {"/usr/lib", "/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/local/lib"}


def _pkg_flags() -> tuple[list[str], list[str]]:
    for pkg in ("starpu-1.4", "starpu-1.3"):
        try:
            cflags = subprocess.check_output(
                ["pkg-config", "--cflags", pkg], text=True, stderr=subprocess.DEVNULL
            )
            libs = subprocess.check_output(["pkg-config", "--libs", pkg], text=True)
        except (OSError, subprocess.CalledProcessError):
            continue
        libdir = subprocess.check_output(["pkg-config", "--variable=libdir", pkg], text=True).strip()
        rpath = [] if libdir in _SYSTEM_LIBDIRS else [f"-Wl,-rpath,{libdir}"]  # the project's own build
        return shlex.split(cflags), shlex.split(libs) + rpath
    raise RuntimeError(
        "StarPU development files not found (pkg-config starpu-1.4 / starpu-1.3); "
        "install them with: apt-get install libstarpu-dev"
    )


def _mpi_flags() -> tuple[list[str], list[str]]:
    """StarPU-MPI and MPI's flags where both are there (the project's own StarPU build,
    OpenMPI's ``mpicc``): the shim is then built with ``TNT_MPI``; else, or with
    ``TORCH_NNTILE_NO_MPI=1`` (the wheel, which cannot carry OpenMPI's plugins), nothing."""
    if os.environ.get("TORCH_NNTILE_NO_MPI") == "1":
        return [], []
    try:
        libs = subprocess.check_output(["pkg-config", "--libs", "starpumpi-1.4"], text=True,
                                       stderr=subprocess.DEVNULL)
        mpi_c = subprocess.check_output(["mpicc", "--showme:compile"], text=True, stderr=subprocess.DEVNULL)
        mpi_l = subprocess.check_output(["mpicc", "--showme:link"], text=True, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError):
        return [], []
    return ["-DTNT_MPI", *shlex.split(mpi_c)], [*shlex.split(libs), *shlex.split(mpi_l)]


def _quiet_cuda_headers(cflags: list[str]) -> list[str]:
    """A StarPU with CUDA includes CUDA's headers (cuSPARSE's declare hundreds of
    deprecated types): their deprecation warnings are not the shim's."""
    return ["-Wno-deprecated-declarations"] if any("cuda" in f for f in cflags if f.startswith("-I")) else []


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
_cflags, _libs = _pkg_flags()
_mpi_c, _mpi_l = _mpi_flags()
_cflags, _libs = _cflags + _mpi_c, _mpi_l + _libs
ffibuilder.set_source(
    "torch_nntile.runtime._shim",
    '#include "shim.h"\n',
    sources=[os.path.relpath(os.path.join(_CSRC, f))
             for f in ("shim.c", "memory.c", "disk.c", "failures.c", "submit.c", "products.c", "share.c", "dist.c",
                       "ew.c", "rows.c", "nn.c", "typed.c", "gemm.c", "cuda.c")],
    include_dirs=[_CSRC],
    extra_compile_args=_cflags + _quiet_cuda_headers(_cflags) + ["-O3", "-fno-math-errno", "-fno-trapping-math",
                                                                 "-Wall", "-Wextra", "-Wno-unused-parameter"],
    extra_link_args=_libs + ["-lm", "-ldl"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=False)
