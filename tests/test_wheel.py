"""The manylinux wheel (`make wheel`) works where StarPU is not installed.

It is installed into a fresh venv beside torch==2.13.0; its extension must find
libstarpu inside the wheel (torch_nntile.libs/), never the system's, and a smoke
script (a tiled product, one SGD step) must match CPU PyTorch there. The system
StarPU cannot be uninstalled for the test, so the proof is what the dynamic
loader picks: `ldd` on the installed extension, and the process's own memory map,
both run with LD_LIBRARY_PATH unset.

Slow (builds and installs): `make test-wheel`, or
`pytest -m slow tests/test_wheel.py` (TORCH_NNTILE_WHEEL=path uses a built wheel).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TORCH_PIN = "torch==2.13.0"  # never unpinned: that would fetch a CUDA build of several GB

SMOKE = r"""
import copy
import os

import torch
import torch.nn.functional as F

import torch_nntile

assert torch_nntile.__version__ == "0.1.0", torch_nntile.__version__
assert torch_nntile.built_with_cuda() is False
torch_nntile.init_context(ncpu=2)

libs_dir = os.path.realpath(os.path.join(os.path.dirname(torch_nntile.__file__), "..", "torch_nntile.libs"))
with open("/proc/self/maps") as f:
    mapped = {line.split()[-1] for line in f if "libstarpu" in line}
assert mapped and all(os.path.dirname(os.path.realpath(p)) == libs_dir for p in mapped), mapped


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


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
from torch.utils.data import DataLoader, TensorDataset
batches = list(DataLoader(TensorDataset(torch.arange(6.0)), batch_size=4, pin_memory=True))
assert [b[0].tolist() for b in batches] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]
assert torch.equal(torch.arange(3.0).pin_memory(), torch.arange(3.0))
print("smoke ok", sorted(mapped))
"""


def _env(tmp: Path) -> dict[str, str]:
    """The environment of a user with nothing set up: no library path, no source tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV")}
    env["STARPU_HOME"] = str(tmp / "starpu_home")
    env["STARPU_SILENT"] = "1"
    return env


def _run(cmd: list[str], tmp: Path, timeout: int = 900) -> str:
    p = subprocess.run(cmd, cwd=tmp, env=_env(tmp), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd[:3]} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """TORCH_NNTILE_WHEEL if set (`make test-wheel` passes `make wheel`'s), else one built here."""
    given = os.environ.get("TORCH_NNTILE_WHEEL")
    if given:
        return Path(given).resolve()
    out = tmp_path_factory.mktemp("wheelhouse")
    p = subprocess.run(["bash", str(ROOT / "scripts" / "build_wheel.sh")], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "WHEEL_DIR": str(out)}, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (path,) = out.glob("torch_nntile-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory) -> tuple[Path, Path]:
    """A fresh venv with torch and the wheel: its python and its site-packages."""
    tmp = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", str(tmp / "venv")], tmp)
    py = tmp / "venv" / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "-q", TORCH_PIN, str(wheel)], tmp)
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp).strip())
    return py, site


def test_wheel_is_manylinux_and_bundles_starpu_only(wheel):
    assert re.fullmatch(r"torch_nntile-0\.1\.0-cp311-cp311-manylinux_2_\d+_x86_64\.whl", wheel.name), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    libs = [n.split("/", 1)[1] for n in names if n.startswith("torch_nntile.libs/") and not n.endswith("/")]
    assert any(n.startswith("libstarpu") for n in libs), libs
    assert any(n.startswith("libhwloc") for n in libs), libs
    assert not [n for n in libs if re.match(r"lib(torch|c10|gomp|python|c\.|m\.|pthread)", n)], libs
    assert not [n for n in names if n.endswith((".c", ".h"))]  # the C sources stay in the sdist


def test_extension_resolves_starpu_inside_the_wheel(venv, tmp_path):
    _, site = venv
    (ext,) = (site / "torch_nntile" / "runtime").glob("_shim*.so")
    out = _run(["ldd", str(ext)], tmp_path)
    assert "not found" not in out, out
    resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", out, re.M))
    starpu = [Path(p).resolve() for n, p in resolved.items() if n.startswith("libstarpu")]
    assert starpu and all(p.parent == (site / "torch_nntile.libs").resolve() for p in starpu), out
    assert not [p for n, p in resolved.items() if "starpu" in n and p.startswith(("/usr/lib", "/lib"))], out
    assert not [n for n in resolved if n.startswith(("libtorch", "libc10"))], out  # BLAS comes from torch at run time


def test_smoke_in_fresh_venv(venv, tmp_path):
    py, _ = venv
    (tmp_path / "smoke.py").write_text(SMOKE)
    out = _run([str(py), "smoke.py"], tmp_path, timeout=300)
    assert "smoke ok" in out and "torch_nntile.libs" in out, out
