"""The CUDA wheel (`make wheel-cuda`) and the check that its NVIDIA libraries load.

Fast: torch_nntile.runtime.cuda_libs on stand-in modules and a stand-in loader — a build
without CUDA imports the shim at once and never looks for NVIDIA's wheels; a shim whose
import fails for want of libcudart/libcublas(Lt) is retried after loading them from the
``nvidia/cu13/lib`` folders on sys.path; where they are not there or do not load, the
error names the library and the pip command that installs it.

Slow (`make test-wheel-cuda`, or TORCH_NNTILE_CUDA_WHEEL=path): the CUDA wheel, built
against the StarPU of `make starpu-cuda`, carries libstarpu but no CUDA library, depends
on NVIDIA's wheels, passes the smoke script in a fresh venv (no GPU: no CUDA worker
starts), finds CUDA through its RPATH where pip put it, through cuda_libs where it is
elsewhere on sys.path, and fails with the clear error where cuBLAS is missing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_wheel import ROOT, SMOKE, TORCH_PIN, _env, _run, build_wheel, check_wheel_contents, make_venv

from torch_nntile.runtime import cuda_libs

# -- cuda_libs, fast ---------------------------------------------------------------------------

MISSING = "{lib}: cannot open shared object file: No such file or directory"


def _fake_shim(mods: Path, name: str, body: str) -> str:
    """A module ``name`` in ``mods`` whose import runs ``body``."""
    mods.mkdir(exist_ok=True)
    (mods / f"{name}.py").write_text(body)
    return name


def _nvidia_dir(site: Path) -> Path:
    """A site folder with stand-ins of the three libraries where NVIDIA's wheels put them."""
    lib = site / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    for name in cuda_libs.LIBRARIES:
        (lib / name).write_bytes(b"")
    return lib


@pytest.fixture
def loads(monkeypatch) -> list[str]:
    """The paths cuda_libs loads (recorded, not loaded); loading sets FAKE_CUDA_LOADED."""
    seen: list[str] = []

    def load(path: str) -> None:
        seen.append(path)
        os.environ["FAKE_CUDA_LOADED"] = "1"

    monkeypatch.delenv("FAKE_CUDA_LOADED", raising=False)
    monkeypatch.setattr(cuda_libs, "_load", load)
    return seen


def test_an_import_that_works_looks_for_nothing(tmp_path, monkeypatch, loads):
    name = _fake_shim(tmp_path / "mods", "fake_shim_ok", "VALUE = 7\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "mods")])
    monkeypatch.setattr(cuda_libs, "search_dirs", lambda: pytest.fail("looked for NVIDIA's wheels"))
    assert cuda_libs.import_shim(name).VALUE == 7
    assert loads == []


def test_missing_library_is_loaded_from_sys_path_then_imported(tmp_path, monkeypatch, loads):
    body = ("import os\nif not os.environ.get('FAKE_CUDA_LOADED'):\n"
            f"    raise ImportError({MISSING.format(lib='libcublas.so.13')!r})\nVALUE = 8\n")
    name = _fake_shim(tmp_path / "mods", "fake_shim_retry", body)
    lib = _nvidia_dir(tmp_path / "site")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "mods"), str(tmp_path / "empty"), str(tmp_path / "site")])
    assert cuda_libs.import_shim(name).VALUE == 8
    assert loads == [str(lib / n) for n in ("libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13")]


def test_missing_library_nowhere_names_it_and_the_fix(tmp_path, monkeypatch, loads):
    name = _fake_shim(tmp_path / "mods", "fake_shim_missing",
                      f"raise ImportError({MISSING.format(lib='libcudart.so.13')!r})\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "mods")])
    with pytest.raises(ImportError) as e:
        cuda_libs.import_shim(name)
    msg = str(e.value)
    assert "libcudart.so.13" in msg and cuda_libs.FIX in msg and "CPU wheel" in msg, msg
    assert 'pip install "nvidia-cuda-runtime==13.*" "nvidia-cublas==13.*"' in msg
    assert loads == []


def test_unloadable_library_names_it(tmp_path, monkeypatch):
    name = _fake_shim(tmp_path / "mods", "fake_shim_bad",
                      f"raise OSError({MISSING.format(lib='libcublasLt.so.13')!r})\n")
    _nvidia_dir(tmp_path / "site")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "mods"), str(tmp_path / "site")])

    def load(path: str) -> None:
        if path.endswith("libcublasLt.so.13"):
            raise OSError(f"{path}: invalid ELF header")

    monkeypatch.setattr(cuda_libs, "_load", load)
    with pytest.raises(ImportError, match=r"needs libcublasLt\.so\.13 .*invalid ELF header.*pip install") as e:
        cuda_libs.import_shim(name)
    assert isinstance(e.value.__cause__, OSError)


def test_still_failing_after_loading_names_the_library(tmp_path, monkeypatch, loads):
    name = _fake_shim(tmp_path / "mods", "fake_shim_still",
                      f"raise ImportError({MISSING.format(lib='libcublas.so.13')!r})\n")
    _nvidia_dir(tmp_path / "site")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "mods"), str(tmp_path / "site")])
    with pytest.raises(ImportError, match=r"needs libcublas\.so\.13 .*pip install"):
        cuda_libs.import_shim(name)
    assert len(loads) == 3


def test_other_import_errors_pass_unchanged(tmp_path, monkeypatch, loads):
    name = _fake_shim(tmp_path / "mods", "fake_shim_other", "raise ImportError('libstarpu-1.4.so.5: cannot open')\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "mods")])
    with pytest.raises(ImportError, match=r"^libstarpu-1\.4\.so\.5: cannot open$"):
        cuda_libs.import_shim(name)
    assert loads == []


# -- the CUDA wheel, slow ----------------------------------------------------------------------

CUDA_PREFIX = ROOT / ".cache" / "starpu-cuda"
NVIDIA_DIR = "nvidia/cu13/lib"


@pytest.fixture(scope="module")
def cuda_wheel(tmp_path_factory) -> Path:
    """TORCH_NNTILE_CUDA_WHEEL if set (`make test-wheel-cuda`), else one built here
    against `make starpu-cuda`'s StarPU."""
    given = os.environ.get("TORCH_NNTILE_CUDA_WHEEL")
    if given:
        return Path(given).resolve()
    if not (CUDA_PREFIX / "lib" / "pkgconfig" / "starpu-1.4.pc").exists():
        pytest.skip("no CUDA StarPU: make starpu-cuda")
    return build_wheel(tmp_path_factory.mktemp("wheelhouse"), cuda=True,
                       pkg_config_path=str(CUDA_PREFIX / "lib" / "pkgconfig"))


@pytest.fixture(scope="module")
def cuda_venv(cuda_wheel: Path, tmp_path_factory) -> tuple[Path, Path]:
    """A fresh venv with torch and the CUDA wheel, NVIDIA's wheels coming as its dependencies."""
    return make_venv(tmp_path_factory.mktemp("cuda-venv"), TORCH_PIN, str(cuda_wheel))


@pytest.mark.slow
def test_cuda_wheel_carries_starpu_not_cuda(cuda_wheel, tmp_path):
    assert re.fullmatch(r"torch_nntile-0\.1\.0\+cu130-cp311-abi3-manylinux_2_\d+_x86_64\.whl", cuda_wheel.name)
    names = check_wheel_contents(cuda_wheel)
    with zipfile.ZipFile(cuda_wheel) as z:
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = re.findall(r"^Requires-Dist: (.*)$", z.read(meta).decode(), re.M)
        (starpu,) = [n for n in names if n.startswith("torch_nntile.libs/libstarpu")]
        z.extract(starpu, tmp_path)
    assert {"nvidia-cuda-runtime==13.*", "nvidia-cublas==13.*"} <= set(requires), requires
    dyn = _run(["readelf", "-d", str(tmp_path / starpu)], tmp_path)
    assert re.search(r"libcudart\.so\.13", dyn) and f"$ORIGIN/../{NVIDIA_DIR}" in dyn, dyn


@pytest.mark.slow
def test_cuda_wheel_smoke_and_import_error(cuda_venv, tmp_path):
    py, site = cuda_venv
    (tmp_path / "smoke.py").write_text(SMOKE.read_text())
    out = _run([str(py), "smoke.py"], tmp_path, timeout=300)
    assert "smoke ok" in out and "torch_nntile.libs" in out and str(site / NVIDIA_DIR) in out, out

    # cuBLAS gone: the import says what to install
    _run([str(py), "-m", "pip", "uninstall", "-q", "-y", "nvidia-cublas"], tmp_path)
    for code in ("import torch_nntile.runtime.cuda_libs as c; c.import_shim()",
                 "import torch, torch_nntile; torch_nntile.init_context(ncpu=1)"):
        p = subprocess.run([str(py), "-c", code], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                           timeout=300)
        assert p.returncode != 0, p.stdout
        assert "ImportError: torch_nntile: this is the CUDA build" in p.stderr and "libcublas" in p.stderr, p.stderr[-3000:]
        assert cuda_libs.FIX in p.stderr, p.stderr[-3000:]

    # cuBLAS elsewhere on sys.path (not where the RPATH points): found and loaded at import
    extra = tmp_path / "extra"
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--target", str(extra), "nvidia-cublas==13.*"], tmp_path)
    env = {**_env(tmp_path), "PYTHONPATH": str(extra)}
    p = subprocess.run([str(py), "smoke.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "smoke ok" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    assert str(extra / NVIDIA_DIR / "libcublas.so.13") in p.stdout, p.stdout
