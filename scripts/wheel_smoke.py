"""The smoke test of an installed wheel: run in a fresh environment by tests/test_wheel.py,
tests/test_cuda_build.py and the CI's cibuildwheel (test-command), from outside the source
tree, so that what it imports is the wheel.

It checks that StarPU is loaded from the wheel's own copy (the process's mapped
libraries), not from a system StarPU; that a tiled product and one SGD step match
CPU PyTorch; that a CUDA wheel (version ``+cu...``) says it was built with CUDA and
a CPU wheel that it was not. No GPU is needed: without one no CUDA worker starts.
Prints ``smoke ok`` and the StarPU libraries it found.
"""

from __future__ import annotations

import copy
import ctypes
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import torch_nntile


def loaded_libraries() -> list[str]:
    """The paths of the shared libraries this process has loaded (Linux and macOS)."""
    if sys.platform == "darwin":
        dyld = ctypes.CDLL(None)
        dyld._dyld_get_image_name.restype = ctypes.c_char_p
        return [dyld._dyld_get_image_name(i).decode() for i in range(dyld._dyld_image_count())]
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "/" in line})


def bundled_dir() -> str:
    """Where the wheel's repair tool put the libraries it carries."""
    pkg = os.path.dirname(torch_nntile.__file__)
    if sys.platform == "darwin":
        return os.path.realpath(os.path.join(pkg, ".dylibs"))  # delocate
    return os.path.realpath(os.path.join(pkg, "..", "torch_nntile.libs"))  # auditwheel


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main() -> None:
    version, _, local = torch_nntile.__version__.partition("+")
    cuda = local.startswith("cu")
    assert version == "0.1.0", torch_nntile.__version__
    assert torch_nntile.built_with_cuda() is cuda, (torch_nntile.__version__, torch_nntile.built_with_cuda())
    torch_nntile.init_context(ncpu=2)

    starpu = [p for p in loaded_libraries() if "libstarpu" in os.path.basename(p)]
    assert starpu and all(os.path.dirname(os.path.realpath(p)) == bundled_dir() for p in starpu), (starpu, bundled_dir())

    torch.manual_seed(0)
    a, b = torch.randn(7, 5), torch.randn(5, 6)
    an, bn = a.to("nntile"), b.to("nntile")
    torch_nntile.set_axis_group_name(an, {0: "m", 1: "k"})
    torch_nntile.set_axis_group_tiling("m", [3, 4])
    torch_nntile.set_axis_group_tiling("k", 2)
    got = (an @ bn).cpu()
    assert got.shape == (7, 6) and rel_err(got, a @ b) <= 1e-5, rel_err(got, a @ b)

    ref = torch.nn.Linear(5, 3)
    model = copy.deepcopy(ref).to("nntile")
    x, t = torch.randn(10, 5), torch.randn(10, 3)
    xn = x.to("nntile")
    torch_nntile.set_axis_group_name(xn, {0: "batch"})
    torch_nntile.set_axis_group_tiling("batch", [4, 6])
    losses = []
    for net, inp, target in ((model, xn, t.to("nntile")), (ref, x, t)):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        loss = F.mse_loss(net(inp), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert abs(losses[0] - losses[1]) <= 1e-5 * max(1.0, abs(losses[1])), losses
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.device.type == "nntile" and rel_err(p.detach().cpu(), q.detach()) <= 1e-5

    # the wheel has no C++ library: pinning for nntile is a plain copy, and it still works
    batches = list(DataLoader(TensorDataset(torch.arange(6.0)), batch_size=4, pin_memory=True))
    assert [b[0].tolist() for b in batches] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]
    assert torch.equal(torch.arange(3.0).pin_memory(), torch.arange(3.0))
    cuda_libs = [p for p in loaded_libraries() if os.path.basename(p).startswith(("libcudart", "libcublas"))]
    print("smoke ok", sorted(starpu), "cuda:", sorted(cuda_libs))


if __name__ == "__main__":
    main()
