"""examples/train_gpt2_hf.py: a stock HF GPT-2 trained on CPU and on nntile from one seed
ends with the same weights (compare <= 1e-4), its checkpoints resume exactly, and it
saves its loss curve. The trainings run in this process (the conftest's StarPU context)
at tiny sizes; the shell driver, three fresh interpreters, is slow."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TINY = ["--epochs", "2", "--steps-per-epoch", "3", "--seq-len", "16", "--batch-size", "8"]
MAX_REL = 1e-4


def _load():
    spec = importlib.util.spec_from_file_location("train_gpt2_hf", EXAMPLES / "train_gpt2_hf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ex = _load()


def _compare(a: Path, b: Path, capsys) -> tuple[dict[str, float], float]:
    """compare's per-parameter lines and its final maximum."""
    capsys.readouterr()
    assert ex.main(["compare", str(a), str(b)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    m = re.fullmatch(r"max relative difference: (\S+)", lines[-1])
    assert m, lines[-1]
    per = {name: float(v) for name, v in (line.split() for line in lines[:-1])}
    return per, float(m.group(1))


def _state(path: Path) -> dict:
    return torch.load(path / ex.STATE_FILE, weights_only=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Two epochs on CPU, and on nntile with the batch tiled unevenly."""
    out = tmp_path_factory.mktemp("gpt2")
    ex.main(["train", "--device", "cpu", "--output-dir", str(out / "cpu"), *TINY])
    ex.main(["train", "--device", "nntile", "--output-dir", str(out / "nntile"), "--tile-batch", "3,5", *TINY])
    return out


def test_cpu_and_nntile_train_to_the_same_weights(runs, capsys):
    per, worst = _compare(runs / "nntile", runs / "cpu", capsys)
    assert "transformer.wte.weight" in per and "lm_head.weight" not in per  # tied: listed once
    assert len(per) == 2 + 12 * 2 + 2  # embeddings, 12 per layer, final norm
    assert worst == pytest.approx(max(per.values()), rel=1e-3)
    assert worst <= MAX_REL
    cpu, dev = _state(runs / "cpu"), _state(runs / "nntile")
    assert len(cpu["history"]) == len(dev["history"]) == 2 and len(cpu["history"][0]) == 3
    for a, b in zip(sum(cpu["history"], []), sum(dev["history"], [])):
        assert abs(a - b) <= 1e-4 * abs(a)
    assert max(per.values()) > 0  # the runs were on different devices, not one copied


def test_compare_reports_a_difference(runs, tmp_path, capsys):
    """A checkpoint trained one epoch less differs visibly from the two-epoch one."""
    ex.main(["train", "--device", "cpu", "--output-dir", str(tmp_path), *TINY[2:], "--epochs", "1"])
    per, worst = _compare(tmp_path, runs / "cpu", capsys)
    assert worst > 1e-3 and worst == pytest.approx(max(per.values()), rel=1e-3)


def test_checkpoint_files_and_loss_png(runs):
    for device in ("cpu", "nntile"):
        d = runs / device
        assert (d / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert json.loads((d / "config.json").read_text())["architectures"] == ["GPT2LMHeadModel"]
        assert (d / "model.safetensors").is_file()
        st = _state(d)
        assert st["epoch"] == 2 and st["device"] == device and st["run"]["steps_per_epoch"] == 3
        assert all(v.device.type == "cpu" for s in st["optimizer"]["state"].values() for v in s.values())


def test_resume_on_nntile_matches_training_straight_through(runs, tmp_path, capsys):
    """One epoch, then a resume (optimizer moments back onto nntile) for the second:
    the weights and losses of two epochs straight."""
    d = tmp_path / "resumed"
    ex.main(["train", "--device", "nntile", "--output-dir", str(d), "--tile-batch", "3,5", *TINY[2:], "--epochs", "1"])
    assert _state(d)["epoch"] == 1
    with pytest.raises(SystemExit, match="differs from the checkpoint"):
        ex.main(["train", "--checkpoint", str(d), "--output-dir", str(d), "--epochs", "2", "--lr", "0.5"])
    ex.main(["train", "--device", "nntile", "--checkpoint", str(d), "--output-dir", str(d), "--epochs", "2",
             "--tile-batch", "3,5"])
    per, worst = _compare(d, runs / "nntile", capsys)
    assert worst == 0.0, {k: v for k, v in per.items() if v > 0}  # the tile tasks' order is fixed: exact
    assert _state(d)["history"] == _state(runs / "nntile")["history"]


def test_text_file_as_byte_tokens(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(256)) * 2)  # 512 bytes: 32 windows of 16
    out = tmp_path / "out"
    ex.main(["train", "--text", str(text), "--output-dir", str(out), "--epochs", "1", "--seq-len", "16",
             "--no-shuffle"])
    assert "text " in capsys.readouterr().out
    st = _state(out)
    assert len(st["history"][0]) == 4 and st["run"]["shuffle"] is False  # 32 windows, batches of 8
    small = tmp_path / "small.json"
    small.write_text(json.dumps({**json.loads((EXAMPLES / "gpt2_tiny.json").read_text()), "vocab_size": 128}))
    with pytest.raises(SystemExit, match="at least 256"):
        ex.main(["train", "--text", str(text), "--config", str(small), "--output-dir", str(tmp_path / "x")])


def test_synthetic_data_is_seeded_and_learnable():
    a, b = ex.synthetic_windows(6, 10, 50, seed=3), ex.synthetic_windows(6, 10, 50, seed=3)
    assert torch.equal(a, b) and not torch.equal(a, ex.synthetic_windows(6, 10, 50, seed=4))
    succ = {}
    for x, y in zip(a[:, :-1].flatten().tolist(), a[:, 1:].flatten().tolist()):
        assert succ.setdefault(x, y) == y  # each token has one successor
    w = torch.arange(40).view(10, 4)
    shuffled = [ex.epoch_batches(w, 4, 2, e, 0, True) for e in (0, 0, 1)]
    first, again, other = ([b.tolist() for b in it] for it in shuffled)
    assert first == again and first != other
    assert [b.tolist() for b in ex.epoch_batches(w, 4, 2, 0, 0, False)] == [w[:4].tolist(), w[4:8].tolist()]


def test_help(capsys):
    for argv in ([], ["train"], ["compare"]):
        with pytest.raises(SystemExit) as e:
            ex.main([*argv, "--help"])
        assert e.value.code == 0
    assert "--tile-batch" in capsys.readouterr().out
    sh = subprocess.run([EXAMPLES / "run_gpt2_hf_cpu_vs_nntile.sh", "--help"], capture_output=True, text=True,
                        check=True)
    assert "OUT_DIR" in sh.stdout


@pytest.mark.slow
def test_shell_driver_trains_both_and_compares(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    r = subprocess.run([EXAMPLES / "run_gpt2_hf_cpu_vs_nntile.sh", tmp_path, *TINY, "--tile-batch", "4"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    m = re.search(r"^max relative difference: (\S+)$", r.stdout, re.M)
    assert m and float(m.group(1)) <= MAX_REL, r.stdout
    assert (tmp_path / "cpu" / "loss.png").is_file() and (tmp_path / "nntile" / "loss.png").is_file()
