"""The host side outside StarPU: torch's math libraries (BLAS the C kernels call, vector
math warmed before the workers use it) and host copies in memory the shim holds.
"""

from __future__ import annotations

import functools
import os

import torch

from torch_nntile.runtime.cuda_libs import import_shim


@functools.cache  # once a process: the initialisation it forces is the process's
def _warm_vector_math() -> None:
    """Make PyTorch's first vectorized math calls here, before any worker does.

    Its MKL-backed vector math initializes lazily and not thread-safely: two workers
    making their first ``exp`` at once, after a matrix product ran in them, were seen
    to get values off by about 3e-5 (2 runs in 30, reproduced without torch_nntile)."""
    for dtype in (torch.float32, torch.float64):
        x = torch.linspace(-2, 2, 64, dtype=dtype)
        for fn in (torch.exp, torch.log1p, torch.tanh, torch.erf, torch.sigmoid, torch.sin, torch.cos, torch.rsqrt):
            fn(x.abs() if fn is torch.log1p or fn is torch.rsqrt else x)
        torch.log(x.abs() + 1)


_BLAS_SYMBOLS = ("sgemm_", "dgemm_", "MKL_Set_Num_Threads_Local",
                 "cblas_sgemm_pack_get_size", "cblas_sgemm_pack", "cblas_sgemm_compute")


def _find_blas() -> tuple[int, ...]:
    """Addresses of ``_BLAS_SYMBOLS`` in the library torch runs its CPU matrix products
    with (0 where it does not export one). MKL's ``MKL_Set_Num_Threads_Local`` is the C,
    by-value entry; the lower-case name takes a pointer."""
    import ctypes
    import glob

    out = [0] * len(_BLAS_SYMBOLS)
    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    for path in sorted(glob.glob(os.path.join(libdir, "libtorch_cpu*.so*"))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for i, sym in enumerate(_BLAS_SYMBOLS):
            if not out[i] and hasattr(lib, sym):
                out[i] = ctypes.cast(getattr(lib, sym), ctypes.c_void_p).value or 0
    return tuple(out)



HOST_COPY = "_tnt_host_copy"  # the attribute holding a host copy's address (host_copy)


def host_copy(cpu: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``cpu`` (its values now) in memory the shim holds
    (``tnt_blob_new``), for an ingress: the tasks copying it into tiles run in C and hold
    the bytes from their submission until they have run. The memory goes back once
    this tensor (with its views) is gone and those tasks are done, in either order."""
    import ctypes
    import weakref

    _shim = import_shim()
    cpu = cpu.detach()
    if cpu.layout != torch.strided:
        return cpu.clone(memory_format=torch.contiguous_format)
    n = cpu.numel() * cpu.element_size()
    ptr = _shim.lib.tnt_blob_new(n)
    if ptr == _shim.ffi.NULL:
        raise MemoryError(f"torch_nntile: no memory for a copy of {n} bytes of CPU data")
    addr = int(_shim.ffi.cast("uintptr_t", ptr))
    raw = (ctypes.c_char * max(n, 1)).from_address(addr)
    weakref.finalize(raw, _shim.lib.tnt_blob_release, ptr).atexit = False  # the tensor keeps raw alive
    out = torch.frombuffer(raw, dtype=torch.uint8)[:n].view(cpu.dtype).view(cpu.shape)
    if cpu.is_contiguous() and not cpu.is_conj() and not cpu.is_neg():
        # one thread: torch's copy_ of 32768 elements or more wakes its OpenMP team on the
        # recording thread, which then spins on the cores the workers run on (the small
        # GPT-2 with dropout copies seven masks a step: its products ran 20-30 % slower)
        ctypes.memmove(addr, cpu.data_ptr(), n)
    else:
        out.copy_(cpu)
    setattr(out, HOST_COPY, addr)
    return out

