"""Out-of-core memory: init_context(memory_limit=..., swap_dir=..., swap_size=...).

A bad request raises before anything starts; a training run whose tiles need about
three times the limit gives the losses of the same run in memory; a tile larger than
the limit is a TileMemoryError naming the sizes, not a hang. The runs are subprocesses:
the suite's context is in memory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import torch_nntile


def _run(code: str, swap_dir, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, out of core allowed, with the swap folder as its
    argument; a hang fails the test through the timeout."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(swap_dir)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TORCH_NNTILE_EXPERIMENTAL_OOC": "1", **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_out_of_core_is_behind_its_switch(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_NNTILE_EXPERIMENTAL_OOC", raising=False)
    with pytest.raises(NotImplementedError, match="TORCH_NNTILE_EXPERIMENTAL_OOC=1"):
        torch_nntile.init_context(memory_limit=64 << 20, swap_dir=tmp_path)


def test_bad_requests_raise_before_starting(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_NNTILE_EXPERIMENTAL_OOC", "1")
    with pytest.raises(ValueError, match="memory_limit needs swap_dir"):
        torch_nntile.init_context(memory_limit=64 << 20)
    with pytest.raises(ValueError, match="take effect with memory_limit"):
        torch_nntile.init_context(swap_dir=tmp_path)
    with pytest.raises(ValueError, match="at least 1 MiB, got 1000"):
        torch_nntile.init_context(memory_limit=1000, swap_dir=tmp_path)
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError, match=f"swap_dir '{missing}' does not exist"):
        torch_nntile.init_context(memory_limit=64 << 20, swap_dir=missing)
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        torch_nntile.init_context(memory_limit=64 << 20, swap_dir=a_file)
    too_big = shutil.disk_usage(tmp_path).free + (1 << 30)
    with pytest.raises(OSError, match=f"swap_size {too_big} bytes .* is more than the"):
        torch_nntile.init_context(memory_limit=64 << 20, swap_dir=tmp_path, swap_size=too_big)


_TRAIN = """
import json, os, sys
import torch, torch.nn as nn, torch.nn.functional as F
import torch_nntile

swap = sys.argv[1]
ooc = os.environ.get("OOC") == "1"
if ooc:
    torch_nntile.init_context(ncpu=2, memory_limit=32 << 20, swap_dir=swap, swap_size=1 << 30)
torch.manual_seed(0)
w = 768  # weights, gradients and AdamW's moments of 4 products and a head: about 40 MB, and activations
model = nn.Sequential(*[nn.Linear(w, w, bias=False) for _ in range(4)], nn.Linear(w, 10)).to("nntile")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(512, w).to("nntile"), torch.randint(0, 10, (512,)).to("nntile")
for i, m in enumerate(model):
    torch_nntile.set_axis_group_name(m.weight, {0: f"out{i}"})
    torch_nntile.set_axis_group_tiling(f"out{i}", 256 if m.weight.shape[0] > 10 else 10)
torch_nntile.set_axis_group_name(x, {0: "batch", 1: "features"})
torch_nntile.set_axis_group_tiling("batch", 256)
torch_nntile.set_axis_group_tiling("features", 256)
losses = []
for _ in range(3):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
torch_nntile.wait()
print(json.dumps({"losses": losses, "files": sum(len(f) for _, _, f in os.walk(swap))}))
"""


@pytest.mark.slow
def test_training_three_times_the_limit_gives_the_in_memory_losses(tmp_path):
    mem = json.loads(_run(_TRAIN, tmp_path).stdout.splitlines()[-1])
    ooc = json.loads(_run(_TRAIN, tmp_path, OOC="1").stdout.splitlines()[-1])
    for a, b in zip(mem["losses"], ooc["losses"]):
        assert abs(a - b) <= 1e-6 * abs(a), (mem, ooc)
    assert ooc["files"] > 0  # tiles went to disk


_TOO_BIG = """
import json, sys
import torch, torch_nntile
torch_nntile.init_context(ncpu=2, memory_limit=4 << 20, swap_dir=sys.argv[1], swap_size=64 << 20)
res = {}
x = torch.ones(2 << 20, device="nntile")  # one 8 MiB tile
try:
    (x * 2).sum().item()
except Exception as e:
    res["error"] = [type(e).__name__, str(e)]
small = torch.arange(6.0, device="nntile")
res["later"] = (small * 2).sum().item()  # later work still runs
print(json.dumps(res))
"""


def test_a_tile_larger_than_the_limit_raises(tmp_path):
    res = json.loads(_run(_TOO_BIG, tmp_path).stdout.splitlines()[-1])
    name, msg = res["error"]
    assert name == "TileMemoryError"
    assert "you tried to allocate 8388608 bytes (8.00 MiB), more than the out-of-core memory_limit of 4194304" in msg
    assert res["later"] == 30.0

