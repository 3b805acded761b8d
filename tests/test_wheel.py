"""The manylinux wheel (`make wheel`) works where StarPU is not installed.

It is installed into a fresh venv beside torch==2.13.0; its extension must find
libstarpu inside the wheel (torch_nntile.libs/), never the system's, and a smoke
script (a tiled product, one SGD step) must match CPU PyTorch there. The system
StarPU cannot be uninstalled for the test, so the proof is what the dynamic
loader picks: `ldd` on the installed extension, and the process's own memory map,
both run with LD_LIBRARY_PATH unset. The smoke script is scripts/wheel_smoke.py, which
the CI's cibuildwheel runs too. The wheel is cp311-abi3 (Python's limited API): one
for every CPython from 3.11 on.

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

SMOKE = ROOT / "scripts" / "wheel_smoke.py"  # shared with the CI's cibuildwheel test-command


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


def build_wheel(out: Path, cuda: bool, pkg_config_path: str | None = None) -> Path:
    """scripts/build_wheel.sh into ``out``: the CPU wheel, or with ``cuda`` the CUDA one."""
    env = {**os.environ, "WHEEL_DIR": str(out), "TORCH_NNTILE_CUDA": str(int(cuda))}
    if pkg_config_path is not None:
        env["PKG_CONFIG_PATH"] = pkg_config_path
    p = subprocess.run(["bash", str(ROOT / "scripts" / "build_wheel.sh")], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (path,) = out.glob("torch_nntile-*.whl")
    return path


def make_venv(tmp: Path, *requirements: str) -> tuple[Path, Path]:
    """A fresh venv in ``tmp`` with ``requirements`` installed: its python and its site-packages."""
    _run([sys.executable, "-m", "venv", str(tmp / "venv")], tmp)
    py = tmp / "venv" / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "-q", *requirements], tmp)
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp).strip())
    return py, site


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """TORCH_NNTILE_WHEEL if set (`make test-wheel` passes `make wheel`'s), else one built here."""
    given = os.environ.get("TORCH_NNTILE_WHEEL")
    if given:
        return Path(given).resolve()
    return build_wheel(tmp_path_factory.mktemp("wheelhouse"), cuda=False)


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory) -> tuple[Path, Path]:
    """A fresh venv with torch and the wheel: its python and its site-packages."""
    return make_venv(tmp_path_factory.mktemp("venv"), TORCH_PIN, str(wheel))


def check_wheel_contents(wheel: Path) -> list[str]:
    """What every Linux wheel must be, CPU or CUDA: libstarpu and hwloc bundled, nothing of
    torch, python, libc or CUDA; every extension abi3; no C source. Returns its names."""
    names = zipfile.ZipFile(wheel).namelist()
    libs = [n.split("/", 1)[1] for n in names if n.startswith("torch_nntile.libs/") and not n.endswith("/")]
    assert any(n.startswith("libstarpu") for n in libs), libs
    assert any(n.startswith("libhwloc") for n in libs), libs
    assert not [n for n in libs if re.match(r"lib(torch|c10|gomp|python|c\.|m\.|pthread|cuda|cudart|cublas|nv)", n)], libs
    extensions = [n for n in names if n.startswith("torch_nntile/") and ".so" in n]
    assert sorted(Path(n).name for n in extensions) == ["_refs.abi3.so", "_shim.abi3.so", "_structure.abi3.so"], extensions
    assert not [n for n in names if n.endswith((".c", ".h"))]  # the C sources stay in the sdist
    return names


def test_wheel_is_manylinux_and_bundles_starpu_only(wheel):
    assert re.fullmatch(r"torch_nntile-0\.1\.0-cp311-abi3-manylinux_2_\d+_x86_64\.whl", wheel.name), wheel.name
    check_wheel_contents(wheel)


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
    (tmp_path / "smoke.py").write_text(SMOKE.read_text())
    out = _run([str(py), "smoke.py"], tmp_path, timeout=300)
    assert "smoke ok" in out and "torch_nntile.libs" in out, out
