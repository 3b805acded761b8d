"""examples/train_cnn.py: a small CNN (convolutions, batch norm, ReLU, max pooling, a
linear layer) on the offline digits, the batch tiled, trained beside a CPU copy. Each
run is a subprocess, brief: few steps, few channels. Every logged loss matches CPU's to a
relative 1e-5 (plus 1e-6, the printed precision), the weights and batch norm's running
statistics to 1e-5, and nothing runs on the host fallback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "train_cnn.py"
ACCURACY = re.compile(r"^test accuracy: (\d\.\d{4})$", re.M)
LOSS_RTOL, PRINTED = 1e-5, 1e-6  # per step: |nntile - cpu| <= LOSS_RTOL * |cpu| + PRINTED
WEIGHT_ATOL = 1e-5


def run_example(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run the example as a user would (no TORCH_NNTILE_* variables from this process),
    with StarPU's files in ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_NNTILE_")}
    env.update(STARPU_SILENT="1", STARPU_HOME=str(tmp_path / "starpu"))
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)


def test_help(tmp_path):
    r = run_example("--help", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    for flag in ("--steps", "--batch-size", "--batch-tile", "--channels", "--lr", "--momentum", "--ncpu", "--seed",
                 "--log-every", "--print-axis-groups", "--compare-torch", "--info", "--no-progress"):
        assert flag in r.stdout


def test_cnn_on_digits_against_torch(tmp_path):
    r = run_example("--steps", "4", "--batch-size", "48", "--batch-tile", "20", "--channels", "4", "--log-every", "1",
                    "--compare-torch", "--print-axis-groups", "--no-progress", tmp_path=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "scikit-learn digits 8x8: 1438 train / 359 test samples, 64 features" in out
    assert "CNN 1x8x8 conv4-bn-relu-pool conv8-bn-relu-pool linear-10, batch 48 tiled by 20" in out
    steps = re.findall(r"^step (\d+): loss nntile (\d+\.\d{6}) cpu (\d+\.\d{6}) diff (\S+)$", out, re.M)
    assert [int(s[0]) for s in steps] == [1, 2, 3, 4], out
    for _, got, want, _ in steps:
        assert abs(float(got) - float(want)) <= LOSS_RTOL * float(want) + PRINTED, (got, want)
    assert float(steps[-1][2]) < float(steps[0][2])
    assert re.search(r"^name='batch' extent=48 members=\d+ (pending_)?ntiles=3 (pending_)?tiles=20,20,8$", out, re.M), out
    diff = re.search(r"^max weight difference: (\S+) \(largest weight \S+\)$", out, re.M)
    assert diff and float(diff.group(1)) <= WEIGHT_ATOL, out  # batch norm's running statistics included
    assert re.search(r"^cpu test accuracy: \d\.\d{4}$", out, re.M)
    assert "host fallbacks: none" in out
    assert out.rstrip().splitlines()[-1] == ACCURACY.search(out).group(0)


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be at least 1"),
    (["--batch-tile", "0"], "--batch-tile must be at least 1"),
    (["--log-every", "-1"], "--log-every must not be negative"),
    (["--batch-size", "5000"], "--batch-size 5000 exceeds the 1438 training samples"),
])
def test_bad_arguments(tmp_path, args, message):
    r = run_example(*args, tmp_path=tmp_path)
    assert r.returncode != 0
    assert message in r.stderr


@pytest.mark.slow
def test_default_run_learns_the_digits_as_cpu_does(tmp_path):
    """The default run (200 steps): at least 0.95 on both, within 0.01 of each other."""
    r = run_example("--compare-torch", "--no-progress", tmp_path=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    cpu = float(re.search(r"^cpu test accuracy: (\d\.\d{4})$", r.stdout, re.M).group(1))
    got = float(ACCURACY.search(r.stdout).group(1))
    assert min(cpu, got) >= 0.95 and abs(cpu - got) <= 0.01, r.stdout
    assert "host fallbacks: none" in r.stdout
