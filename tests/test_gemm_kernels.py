"""The shim's own float32 product kernels (``runtime/csrc/gemm.c``) checked in C against
a double-precision reference over 400 random cases (``tests/csrc/check_gemm.c``): shapes
off the kernels' 12 x 32 blocks, several k blocks, wide leading dimensions, transposes,
alpha and beta, B packed once or in the call."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "src" / "torch_nntile" / "runtime" / "csrc"
NO_AVX512 = 77  # check_gemm's exit status where the CPU cannot run the kernels


def test_gemm_kernels_match_reference(tmp_path: Path) -> None:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path / "check_gemm"
    subprocess.run([cc, "-O2", "-I", str(CSRC), "-o", str(exe), str(ROOT / "tests" / "csrc" / "check_gemm.c"),
                    str(CSRC / "gemm.c"), "-lm"], check=True, capture_output=True, text=True)
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    if res.returncode == NO_AVX512:
        pytest.skip(res.stdout.strip())
    assert res.returncode == 0, res.stdout + res.stderr
    assert "400 cases, 0 bad" in res.stdout
