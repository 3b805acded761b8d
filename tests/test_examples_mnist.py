"""The MNIST examples: their IDX reader and digits fallback in-process, the scripts
themselves in subprocesses (briefly: few epochs and steps, small layers), their
printed formats, their argument errors and their progress bar."""

from __future__ import annotations

import argparse
import fcntl
import gzip
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

import _mnist_data  # noqa: E402
from train_deep_relu_mnist import axis_tiling  # noqa: E402

DEEP = EXAMPLES / "train_deep_relu_mnist.py"
FIVE = EXAMPLES / "reproduce_google_five_layer_relu_mnist.py"
ACCURACY = re.compile(r"^test accuracy: (\d\.\d{4})$", re.M)


def idx_bytes(values: np.ndarray, code: int = 0x08) -> bytes:
    """An IDX file: two zero bytes, the type code, the rank, the dims and the values, big-endian."""
    be = values.astype(values.dtype.newbyteorder(">"))
    return bytes([0, 0, code, values.ndim]) + struct.pack(f">{values.ndim}I", *values.shape) + be.tobytes()


def write_mnist(folder: Path, n_train: int = 48, n_test: int = 16, gz: bool = False) -> dict[str, np.ndarray]:
    """Four small MNIST-named IDX files of random 28x28 images; returns their arrays."""
    rng = np.random.default_rng(0)
    arrays = {"train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
              "train_labels": rng.integers(0, 10, n_train, dtype=np.uint8),
              "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
              "test_labels": rng.integers(0, 10, n_test, dtype=np.uint8)}
    folder.mkdir(parents=True, exist_ok=True)
    for key, base in _mnist_data.MNIST_FILES.items():
        raw = idx_bytes(arrays[key])
        (folder / (base + ".gz" if gz else base)).write_bytes(gzip.compress(raw) if gz else raw)
    return arrays


def run_example(script: Path, *args: str, tmp_path: Path, stderr_tty: bool = False,
                **env_extra: str) -> subprocess.CompletedProcess:
    """Run an example as a user would, with StarPU's files in ``tmp_path``; with
    ``stderr_tty`` its stderr is a pseudo-terminal (so that the progress bar shows)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_NNTILE_")}
    env.update(STARPU_SILENT="1", STARPU_HOME=str(tmp_path / "starpu"), **env_extra)
    cmd = [sys.executable, str(script), *args]
    if not stderr_tty:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new one is 0 columns wide
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    err = b""
    while True:  # drain the terminal while the script runs, so that it never blocks on a full one
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the script closed its end
                chunk = b""
            if not chunk:
                break
            err += chunk
        elif proc.poll() is not None:
            break
    out = proc.stdout.read()
    proc.wait(timeout=300)
    os.close(master)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err.decode(errors="replace"))


# -- the data module -----------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_load_mnist_reads_idx_files(tmp_path, gz):
    arrays = write_mnist(tmp_path, gz=gz)
    data = _mnist_data.load(str(tmp_path))
    assert data.train_x.shape == (48, 784) and data.test_x.shape == (16, 784)
    assert data.train_x.dtype == torch.float32 and data.train_y.dtype == torch.int64
    assert torch.equal(data.train_x, torch.from_numpy(arrays["train_images"]).reshape(48, -1).float() / 255)
    assert torch.equal(data.test_y, torch.from_numpy(arrays["test_labels"]).long())
    assert "48 train / 16 test samples, 784 features" in data.describe()


@pytest.mark.parametrize("code, dtype", [(0x08, np.uint8), (0x09, np.int8), (0x0B, np.int16), (0x0C, np.int32),
                                         (0x0D, np.float32), (0x0E, np.float64)])
def test_parse_idx_types_big_endian(code, dtype):
    values = (np.arange(24).reshape(2, 3, 4) * (3 if dtype != np.uint8 else 1) - (5 if dtype != np.uint8 else 0))
    values = values.astype(dtype)
    got = _mnist_data.parse_idx(idx_bytes(values, code))
    assert got.shape == (2, 3, 4)
    assert torch.equal(got, torch.from_numpy(values))
    assert torch.equal(_mnist_data.parse_idx(gzip.compress(idx_bytes(values, code))), got)


def test_parse_idx_rejects_bad_files(tmp_path):
    good = idx_bytes(np.zeros((2, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="not an IDX file"):
        _mnist_data.parse_idx(b"\x01\x02\x08\x01" + good[4:])
    with pytest.raises(ValueError, match="not an IDX file"):
        _mnist_data.parse_idx(b"")
    with pytest.raises(ValueError, match="truncated IDX header"):
        _mnist_data.parse_idx(good[:7])
    with pytest.raises(ValueError, match=r"IDX shape \[2, 3\] needs 6 bytes of data, found 5"):
        _mnist_data.parse_idx(good[:-1])
    write_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match="no t10k-labels-idx1-ubyte"):
        _mnist_data.load_mnist(str(tmp_path))
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(3, dtype=np.uint8)))
    with pytest.raises(ValueError, match=r"test images of shape \[16, 28, 28\] do not go with labels of shape \[3\]"):
        _mnist_data.load_mnist(str(tmp_path))


def test_digits_split_and_resize_are_deterministic():
    a, b = _mnist_data.load_digits(side=28), _mnist_data.load_digits(side=28)
    assert a.train_x.shape == (1438, 784) and a.test_x.shape == (359, 784)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    frames = a.train_x.reshape(-1, 28, 28)
    assert frames[:, :4].abs().sum() == 0 and frames[:, :, 24:].abs().sum() == 0  # the 4-pixel frame is empty
    assert 0.0 <= a.train_x.min() and a.train_x.max() <= 1.0
    small = _mnist_data.load_digits()
    assert small.train_x.shape == (1438, 64) and torch.equal(small.train_y, a.train_y)
    assert not torch.equal(_mnist_data.load_digits(seed=1).test_y, a.test_y)
    assert sorted(set(a.train_y.tolist())) == list(range(10))


def test_axis_tiling_argument():
    assert axis_tiling("batch=256") == ("batch", 256)
    assert axis_tiling("hidden1=100,156") == ("hidden1", [100, 156])
    assert axis_tiling(" classes =7") == ("classes", 7)
    for bad in ("batch", "=4", "batch=", "batch=a", "batch=4,", "batch=1.5", "batch=0", "batch=4,-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=SIZE|must be positive"):
            axis_tiling(bad)


# -- the scripts ---------------------------------------------------------------


@pytest.mark.parametrize("script, flags", [
    (DEEP, ["--compare-torch", "--axis-tiling", "--print-axis-groups", "--ncpu", "--epochs", "--depth",
            "--hidden-dim", "--data-dir", "--no-progress"]),
    (FIVE, ["--device", "--steps", "--batch-size", "--ncpu", "--train-log-every", "--test-every",
            "--skip-accuracy-floor", "--data-dir", "--no-progress"]),
])
def test_help(tmp_path, script, flags):
    r = run_example(script, "--help", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    for flag in flags:
        assert flag in r.stdout


def test_deep_relu_on_idx_files_against_torch(tmp_path):
    write_mnist(tmp_path / "mnist", gz=True)
    r = run_example(DEEP, "--data-dir", str(tmp_path / "mnist"), "--epochs", "3", "--depth", "3", "--hidden-dim", "16",
                    "--compare-torch", "--print-axis-groups", "--axis-tiling", "batch=20",
                    "--axis-tiling", "hidden1=5,11", "--axis-tiling", "classes=4", "--no-progress", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "48 train / 16 test samples, 784 features" in r.stdout
    epochs = re.findall(r"^epoch (\d+): loss nntile (\d+\.\d{6}) cpu (\d+\.\d{6}) diff (\S+)$", r.stdout, re.M)
    assert [int(e[0]) for e in epochs] == [1, 2, 3]
    for _, got, want, _ in epochs:
        assert abs(float(got) - float(want)) <= 1e-5
    for name, extent, tiles in (("batch", 48, "3 20,20,8"), ("hidden1", 16, "2 5,11"), ("classes", 10, "3 4,4,2")):
        n, sizes = tiles.split()
        want = rf"^name='{name}' extent={extent} members=\d+ (pending_)?ntiles={n} (pending_)?tiles={sizes}$"
        assert re.search(want, r.stdout, re.M), r.stdout
    diff = re.search(r"^max weight difference: (\S+) \(largest weight \S+\)$", r.stdout, re.M)
    assert diff and float(diff.group(1)) <= 1e-5
    assert ACCURACY.search(r.stdout)


def test_deep_relu_on_digits_shows_a_progress_bar(tmp_path):
    r = run_example(DEEP, "--epochs", "4", "--hidden-dim", "32", tmp_path=tmp_path, stderr_tty=True)
    assert r.returncode == 0, r.stderr
    assert "scikit-learn digits 8x8: 1438 train / 359 test samples, 64 features" in r.stdout
    losses = [float(v) for v in re.findall(r"^epoch \d+: loss nntile (\d+\.\d+)$", r.stdout, re.M)]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert ACCURACY.search(r.stdout)
    assert "epochs: 100%" in r.stderr and "4/4" in r.stderr, r.stderr


@pytest.mark.parametrize("args, message", [
    (["--axis-tiling", "batch=abc"], "argument --axis-tiling: expected NAME=SIZE"),
    (["--axis-tiling", "nosuch=4"], "--axis-tiling nosuch: unknown axis group name 'nosuch'"),
    (["--axis-tiling", "batch=100,200"], "tile sizes [100, 200] sum to 300, but the extent is 1438"),
    (["--depth", "1"], "--depth must be at least 2"),
])
def test_deep_relu_bad_arguments(tmp_path, args, message):
    r = run_example(DEEP, *args, tmp_path=tmp_path)
    assert r.returncode == 2
    assert message in r.stderr and "usage:" in r.stderr


def test_five_layer_briefly_on_idx_files_with_logs(tmp_path):
    write_mnist(tmp_path / "mnist")
    r = run_example(FIVE, "--data-dir", str(tmp_path / "mnist"), "--steps", "6", "--batch-size", "16",
                    "--train-log-every", "2", "--test-every", "3", "--skip-accuracy-floor", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "48 train / 16 test samples, 784 features" in r.stdout
    assert "784-200-100-60-30-10 ReLU MLP on nntile, Adam, batch 16, 6 steps" in r.stdout
    assert [int(s) for s in re.findall(r"^step (\d+): loss \d+\.\d{6} lr 0\.\d{6}$", r.stdout, re.M)] == [2, 4, 6]
    assert re.findall(r"^step (\d+): test accuracy 0\.\d{4}$", r.stdout, re.M) == ["3"]
    assert r.stdout.rstrip().splitlines()[-1].startswith("test accuracy: 0.")
    assert "training on nntile" not in r.stderr  # no bar: stderr is not a terminal


def test_five_layer_fails_below_its_floor(tmp_path):
    r = run_example(FIVE, "--steps", "2", "--train-log-every", "0", tmp_path=tmp_path)
    acc = ACCURACY.search(r.stdout)
    assert acc and float(acc.group(1)) < 0.95
    assert r.returncode == 1
    assert f"test accuracy {acc.group(1)} is below the floor 0.95" in r.stderr


def test_five_layer_dry_run_attributes_host_time(tmp_path):
    r = run_example(FIVE, "--steps", "3", tmp_path=tmp_path, TORCH_NNTILE_SKIP_STARPU="1")
    assert r.returncode == 0, r.stderr  # no floor: a dry run computes nothing
    out = r.stdout
    assert "scikit-learn digits 28x28: 1438 train / 359 test samples, 784 features" in out
    assert "!! TORCH_NNTILE_SKIP_STARPU is set: timings only" in out
    record = re.search(r"^record \(host, inside ATen ops\) +(\d+) ", out, re.M)
    assert record and int(record.group(1)) > 0
    assert re.search(r"^tasks submitted: 0 \(\d+ not submitted: dry run\)", out, re.M)
    assert ACCURACY.search(out)
    assert "the accuracy is not meaningful, its floor is not checked" in out


@pytest.mark.parametrize("args, message", [
    (["--device", "cuda"], "argument --device: invalid choice: 'cuda'"),
    (["--steps", "0"], "--steps must be at least 1"),
])
def test_five_layer_bad_arguments(tmp_path, args, message):
    r = run_example(FIVE, *args, tmp_path=tmp_path)
    assert r.returncode == 2
    assert message in r.stderr


@pytest.mark.slow
def test_five_layer_default_run_reaches_its_floor_on_nntile_and_cpu(tmp_path):
    """The default run (600 steps on the offline digits): at least 0.95 on both devices,
    and within 0.01 of each other."""
    accs = {}
    for device in ("nntile", "cpu"):
        r = run_example(FIVE, "--device", device, tmp_path=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        accs[device] = float(ACCURACY.search(r.stdout).group(1))
    assert min(accs.values()) >= 0.95, accs
    assert abs(accs["nntile"] - accs["cpu"]) <= 0.01, accs
