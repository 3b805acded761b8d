"""Out-of-core memory: init_context(memory_limit=..., swap_dir=..., swap_size=...).

A bad request raises before anything starts; a GPT-2 and an MLP whose tiles need about
three times the limit give the losses of the same runs in memory, and info() counts
what went to disk and back; a tile larger than the limit, or a task whose tiles exceed
a worker's share of it, is a TileMemoryError naming the op and the sizes; a StarPU that
cannot fit the waiting tasks (swap too small, a full disk) raises within seconds and
the process still exits. The graph-aware hints evict a tile right after a use whose
next read is farther off than the limit, learned from the batch's previous run, and
leave the losses as they were. Never a hang: each run is a subprocess with a timeout
(the suite's own context is in memory)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torch_nntile
from torch_nntile.runtime.hints import Hints

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, swap_dir, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, with the swap folder as its argument; a hang
    fails the test through the timeout. Runs that are to stall pass
    ``TORCH_NNTILE_OOC_STALL_S`` (the others keep the default 30 s: a busy machine
    must not look like a stall)."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(swap_dir)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_bad_requests_raise_before_starting(tmp_path):
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
    with pytest.raises(ValueError, match="at least 16 MiB .StarPU's smallest disk., got 4194304"):
        torch_nntile.init_context(memory_limit=64 << 20, swap_dir=tmp_path, swap_size=4 << 20)


def test_gpt2_at_a_third_of_its_tile_memory_gives_the_in_memory_losses(tmp_path):
    """benchmarks/ooc_step.py --quick: the in-memory run measures the tile bytes a step
    needs, the out-of-core run gets a limit of a third (here the 1 MiB floor: 3.8x less)."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ooc_step.py"), "--quick", "--swap-dir",
                          str(tmp_path), "--json", str(tmp_path / "r.json")], capture_output=True, text=True,
                         timeout=300, cwd=ROOT / "benchmarks")
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads((tmp_path / "r.json").read_text())
    mem, ooc = r["in_memory"], r["out_of_core"]
    assert mem["tile_bytes"] >= 3 * r["memory_limit"], r
    assert len(mem["losses"]) == len(ooc["losses"]) == 3
    for a, b in zip(mem["losses"], ooc["losses"]):
        assert abs(a - b) <= 1e-6 * abs(a), (mem["losses"], ooc["losses"])
    assert ooc["evicted_per_step"] > 0 and ooc["loaded_per_step"] > 0, ooc
    assert mem["evicted_per_step"] == mem["loaded_per_step"] == 0
    assert "out of core / in memory:" in out.stdout
    assert os.listdir(tmp_path) == ["r.json"]  # the swap folder is gone with its context


_TASK_TOO_BIG = """
import json, sys
import torch, torch_nntile
torch_nntile.init_context(ncpu=2, memory_limit=4 << 20, swap_dir=sys.argv[1], swap_size=64 << 20)
res = {}
x = torch.ones(768, 512, device="nntile")  # one tile of 1.5 MiB: fits the limit
try:
    (x @ x.T).sum().item()  # 1.5 + 2.25 MiB in one task: more than a worker's 2 MiB
except Exception as e:
    res["error"] = [type(e).__name__, str(e)]
res["x"] = x.sum().item()  # x itself is still there
big = torch.arange(786432.0)  # one tile of 3 MiB: over a worker's share, within the limit
res["one_tile_tasks"] = torch.equal(big.to("nntile").cpu(), big)  # in and out: tasks of that one tile
print(json.dumps(res))
"""


def test_a_task_over_a_workers_share_of_the_limit_raises(tmp_path):
    res = json.loads(_run(_TASK_TOO_BIG, tmp_path).stdout.splitlines()[-1])
    name, msg = res["error"]
    assert name == "TileMemoryError"
    assert ("not enough memory for one task of mm: its tiles need 3932160 bytes (3.75 MiB) at once, more than the "
            "out-of-core memory_limit of 4194304 bytes (4.00 MiB) shared by 2 workers, 2097152 bytes (2.00 MiB) "
            "each") in msg, msg
    assert res["x"] == 768 * 512
    assert res["one_tile_tasks"]  # a task of one tile holds nothing while it waits: the limit is its bound


_OUTGROWN = """
import json, sys, time
import torch, torch_nntile
torch_nntile.init_context(ncpu=2, memory_limit=8 << 20, swap_dir=sys.argv[1], swap_size=16 << 20)
res = {"kept": (torch.arange(10.0, device="nntile") * 3).sum().item()}
xs, t = [], time.monotonic()
try:  # 40 MiB of live tensors: more than the limit and the swap together
    xs = [torch.full((1 << 18,), float(i), device="nntile") + 1 for i in range(40)]
    sum(x.sum().item() for x in xs)
except Exception as e:
    res["error"] = [type(e).__name__, str(e)]
res["seconds"] = time.monotonic() - t
try:
    torch.ones(3, device="nntile").sum().item()
except Exception as e:
    res["later"] = [type(e).__name__, str(e)]
try:
    torch_nntile.wait()
except Exception as e:
    res["wait"] = [type(e).__name__, str(e)]
print(json.dumps(res), flush=True)
"""


def test_tiles_outgrowing_limit_and_swap_raise_instead_of_hanging(tmp_path):
    res = json.loads(_run(_OUTGROWN, tmp_path, TORCH_NNTILE_OOC_STALL_S="3").stdout.splitlines()[-1])
    assert res["kept"] == 135.0
    name, msg = res["error"]
    assert name == "TileMemoryError"
    assert "out of core, no task has run for 3 s" in msg and "memory_limit of 8388608 bytes" in msg, msg
    assert "swap_size of 16777216 bytes" in msg and "The context is stuck" in msg, msg
    assert res["seconds"] < 60
    assert res["later"] == res["wait"] == res["error"]  # the context stays stuck, and says why; the process then exits


@contextlib.contextmanager
def _tmpfs(path: Path, size: str, read_only: bool = False):
    """A small filesystem of its own at ``path`` (needs root and mount rights: else skip)."""
    path.mkdir()
    opts = f"size={size}" + (",ro" if read_only else "")
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                                          capture_output=True).returncode != 0:
        pytest.skip("mounting a small filesystem needs root and mount rights")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def test_a_read_only_swap_dir_raises_before_starting(tmp_path):
    with _tmpfs(tmp_path / "ro", "20m", read_only=True) as ro:
        with pytest.raises(PermissionError, match=f"swap_dir '{ro}' is not writable"):
            torch_nntile.init_context(memory_limit=8 << 20, swap_dir=ro, swap_size=16 << 20)


_DISK_FILLS = """
import json, os, sys
import torch, torch_nntile
swap = sys.argv[1]
torch_nntile.init_context(ncpu=2, memory_limit=8 << 20, swap_dir=swap, swap_size=16 << 20)
with open(os.path.join(swap, "other"), "wb") as f:  # something else fills the disk after the start
    f.write(bytes(15 << 20))
res = {}
try:
    xs = [torch.full((1 << 18,), float(i), device="nntile") + 1 for i in range(20)]
    sum(x.sum().item() for x in xs)
except Exception as e:
    res["error"] = [type(e).__name__, str(e)]
print(json.dumps(res), flush=True)
"""


def test_a_full_swap_disk_is_named(tmp_path):
    with _tmpfs(tmp_path / "small", "20m") as small:
        res = json.loads(_run(_DISK_FILLS, small, TORCH_NNTILE_OOC_STALL_S="3").stdout.splitlines()[-1])
    name, msg = res["error"]
    assert name == "TileMemoryError"
    assert f"swap_dir '{small}' is full (No space left on device" in msg, msg


_TRAIN = """
import json, os, sys
import torch, torch.nn as nn, torch.nn.functional as F
import torch_nntile

swap, w, batch = sys.argv[1], int(os.environ["WIDTH"]), int(os.environ["BATCH"])
if "LIMIT_MIB" in os.environ:
    torch_nntile.init_context(ncpu=2, memory_limit=int(os.environ["LIMIT_MIB"]) << 20, swap_dir=swap, swap_size=1 << 30)
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(w, w, bias=False) for _ in range(4)], nn.Linear(w, 10)).to("nntile")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(batch, w).to("nntile"), torch.randint(0, 10, (batch,)).to("nntile")
for i, m in enumerate(model):
    torch_nntile.set_axis_group_name(m.weight, {0: f"out{i}"})
    torch_nntile.set_axis_group_tiling(f"out{i}", 256 if m.weight.shape[0] > 10 else 10)
torch_nntile.set_axis_group_name(x, {0: "batch", 1: "features"})
torch_nntile.set_axis_group_tiling("batch", batch // 2)
torch_nntile.set_axis_group_tiling("features", 256)
losses = []
for _ in range(int(os.environ["STEPS"])):  # the same batches each step
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
torch_nntile.wait()
info = torch_nntile.info()
print(json.dumps({"losses": losses, "files": sum(len(f) for _, _, f in os.walk(swap)),
                  "hinted": info["hint_evictions"], "evicted": info["bytes_evicted"]}))
"""


def _losses_match(mem: dict, run: dict) -> None:
    for a, b in zip(mem["losses"], run["losses"], strict=True):
        assert abs(a - b) <= 1e-6 * abs(a), (mem, run)


@pytest.mark.slow
def test_training_three_times_the_limit_gives_the_in_memory_losses(tmp_path):
    """Weights, gradients and AdamW's moments of 4 products and a head (768 wide): about
    40 MB, and activations, under 32 MiB."""
    mlp = {"WIDTH": "768", "BATCH": "512", "STEPS": "3"}
    mem = json.loads(_run(_TRAIN, tmp_path, **mlp).stdout.splitlines()[-1])
    ooc = json.loads(_run(_TRAIN, tmp_path, **mlp, LIMIT_MIB="32").stdout.splitlines()[-1])
    _losses_match(mem, ooc)
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



_READ_BACK = """
import json, sys
import torch, torch_nntile
torch_nntile.init_context(ncpu=2, memory_limit=4 << 20, swap_dir=sys.argv[1], swap_size=64 << 20)
x = torch.arange(3 << 20, dtype=torch.float32)  # 12 MiB in 24 tiles of 0.5 MiB: three times the limit
d = x.to("nntile")
torch_nntile.set_axis_group_name(d, {0: "n"})
torch_nntile.set_axis_group_tiling("n", 1 << 17)
y = d * 2 + 1
back = y.cpu()
info = torch_nntile.info()
print(json.dumps({"equal": bool(torch.equal(back, x * 2 + 1)), "evicted": info["bytes_evicted"],
                  "loaded": info["bytes_loaded"], "ooc": info["out_of_core"],
                  "line": torch_nntile.format_info().splitlines()[-1]}))
"""


def test_reading_back_more_than_the_limit_goes_by_groups_of_tiles(tmp_path):
    res = json.loads(_run(_READ_BACK, tmp_path).stdout.splitlines()[-1])
    assert res["equal"]
    assert res["evicted"] > 0 and res["loaded"] > 0, res
    assert res["ooc"] == {"memory_limit": 4 << 20, "swap_dir": str(tmp_path), "swap_size": 64 << 20}
    assert res["line"].startswith("out of core, limit 4.19 MB: evicted to disk "), res["line"]


def test_in_memory_info_has_no_disk_traffic():
    (torch.ones(4, device="nntile") * 2).sum().item()
    info = torch_nntile.info()
    assert info["out_of_core"] is None
    assert info["bytes_evicted"] == info["bytes_loaded"] == 0 and info["data_wait_s"] == 0.0
    assert info["tile_bytes"] > 0
    assert "out of core" not in torch_nntile.format_info()


_SKIPPED_AMONG_REUSED = """
import json, sys
import torch, torch_nntile

def run(device):
    torch.manual_seed(0)
    a = torch.randn(196608, device=device, requires_grad=True)  # one tile of 0.75 MiB
    b = torch.randn(1000, device=device, requires_grad=True)
    opt = torch.optim.AdamW([a, b], lr=0.1)
    for _ in range(6):  # the later steps reuse the tasks of an earlier one, with new scalars (the step count)
        ((a * a).sum() + (b * b).sum()).backward()
        opt.step()
        opt.zero_grad()
        if device == "nntile":
            try:
                torch_nntile.wait()  # a compile a step
            except torch_nntile.TileMemoryError:
                pass  # a's update, every step
    return a, b

if len(sys.argv) > 1:
    torch_nntile.init_context(ncpu=2, memory_limit=4 << 20, swap_dir=sys.argv[1], swap_size=64 << 20)
cpu_a, cpu_b = run("cpu")
a, b = run("nntile")
res = {"b_max_diff": (b.detach().cpu() - cpu_b.detach()).abs().max().item()}
try:
    a.detach().cpu()
except torch_nntile.TileMemoryError as e:
    res["a_error"] = str(e)
res["reused"] = torch_nntile.info()["compiles_reused"]
print(json.dumps(res))
"""


def test_a_skipped_task_leaves_the_others_of_a_reused_step_right(tmp_path):
    """AdamW on a (a tile of 0.75 MiB: its gradient's task, 3 tiles, is over a worker's
    2 MiB) and b: a's tasks are skipped every step; b's, from the same reused tasks with
    each step's scalars, give CPU's values."""
    # the reuse itself is under test: not lowered again to check it (make test-check)
    res = json.loads(_run(_SKIPPED_AMONG_REUSED, tmp_path, TORCH_NNTILE_CHECK_REUSE="0").stdout.splitlines()[-1])
    assert res["reused"] >= 1, res
    assert res["b_max_diff"] <= 1e-6, res
    assert "not enough memory for one task of mul+mul+add: its tiles need 2359296 bytes" in res["a_error"], res


_STUCK_AT_EXIT = """
import sys
import torch, torch_nntile
torch_nntile.init_context(ncpu=2, memory_limit=8 << 20, swap_dir=sys.argv[1], swap_size=16 << 20)
xs = [torch.full((1 << 18,), float(i), device="nntile") + 1 for i in range(40)]
torch_nntile.execute()  # submitted, never read: the exit's wait is the first to find StarPU stuck
print("exiting", flush=True)
"""


def test_a_stall_found_at_exit_ends_the_process(tmp_path):
    out = _run(_STUCK_AT_EXIT, tmp_path, TORCH_NNTILE_OOC_STALL_S="3")
    assert out.stdout.strip() == "exiting"
    assert "torch_nntile: at exit: torch_nntile: out of core, no task has run for 3 s" in out.stderr, out.stderr[-2000:]


_STUCK_IN_PROGRESS = """
import json, sys
import torch, torch_nntile
torch_nntile.init_context(ncpu=2, memory_limit=8 << 20, swap_dir=sys.argv[1], swap_size=16 << 20)
xs = [torch.full((1 << 18,), float(i), device="nntile") + 1 for i in range(40)]
torch_nntile.execute()
try:
    torch_nntile.wait(progress=lambda done, total: None)  # the wait that polls for its progress bar
except torch_nntile.TileMemoryError as e:
    print(json.dumps(str(e)))
"""


def test_a_wait_with_progress_finds_a_stall_too(tmp_path):
    msg = json.loads(_run(_STUCK_IN_PROGRESS, tmp_path, TORCH_NNTILE_OOC_STALL_S="3").stdout.splitlines()[-1])
    assert "out of core, no task has run for 3 s" in msg, msg


_ZERO_SIZE = """
import json, sys
import torch, torch_nntile
torch_nntile.init_context(ncpu=2, memory_limit=8 << 20, swap_dir=sys.argv[1], swap_size=64 << 20)
x = torch.arange(42).reshape(6, 7).to("nntile")
empty = x[:0]  # a value of no elements: no task writes its tile
res = {"slice": list(empty.cpu().shape), "add": list((empty + x[:1]).cpu().shape),
       "scalar": torch.zeros(0, device="nntile").sum().item()}
print(json.dumps(res))
"""


def test_zero_size_values_read_back_out_of_core(tmp_path):
    """Out of core StarPU aborts on reading a tile no task wrote, unless it knows how to
    fill one (tnt_init_cl): a zero-size value's tile is such a tile."""
    res = json.loads(_run(_ZERO_SIZE, tmp_path).stdout.splitlines()[-1])
    assert res == {"slice": [0, 7], "add": [0, 7], "scalar": 0.0}


def test_graph_aware_hints_evict_early_and_keep_the_losses(tmp_path):
    """From the second step on, the hints learned in the first evict tiles early (16 MiB
    of weights, gradients and moments, and activations, under 8 MiB)."""
    mlp = {"WIDTH": "512", "BATCH": "256", "STEPS": "5"}
    mem = json.loads(_run(_TRAIN, tmp_path, **mlp).stdout.splitlines()[-1])
    hinted = json.loads(_run(_TRAIN, tmp_path, **mlp, LIMIT_MIB="8").stdout.splitlines()[-1])
    lru = json.loads(_run(_TRAIN, tmp_path, **mlp, LIMIT_MIB="8", TORCH_NNTILE_OOC_HINTS="0").stdout.splitlines()[-1])
    for run in (hinted, lru):
        _losses_match(mem, run)
        assert run["evicted"] > 0
    assert hinted["hinted"] > 0
    assert lru["hinted"] == 0 and mem["hinted"] == 0


PAGE = 4096
_PAGES = {h: (1024, 4) for h in "xyabcd"}  # tiles of one page (float32)


def _read(h: str) -> tuple[list[str], list[int], list[int]]:
    return [h], [1], [PAGE]


def _write(h: str) -> tuple[list[str], list[int], list[int]]:
    return [h], [2], [PAGE]


def test_hints_evict_after_the_use_before_a_gap_longer_than_the_limit():
    step = [_read("x"), *map(_write, "abcd"), _read("x")]  # x's gap: 4 pages, and x: 5 pages
    far = Hints(limit=3 * PAGE)
    key = far.key("step")
    assert far.plan(key, step, _PAGES) == (0, [])  # the first run of a batch: nothing learned yet
    assert far.plan(key, step, _PAGES) == (1, [0, 1, 0])  # task 0 evicts the tile at position 0 (x) once it ran
    near = Hints(limit=5 * PAGE)
    key = near.key("step")
    assert near.plan(key, step, _PAGES) == near.plan(key, step, _PAGES) == (0, [])  # within the limit: kept


def test_hints_count_only_live_tiles_and_reads():
    for dead in (False, True):
        hints = Hints(limit=3 * PAGE)
        first, second = hints.key("first"), hints.key("second")
        batch = [_read("x"), *map(_write, "abcd")]
        hints.plan(first, batch, _PAGES)
        if dead:
            hints.forget(list("abcd"))  # died before x's next read: they push nothing out
        hints.plan(second, [_read("x")], _PAGES)
        assert hints.plan(first, batch, _PAGES) == ((0, []) if dead else (1, [0, 1, 0]))
    hints = Hints(limit=3 * PAGE)
    key = hints.key("step")
    rewritten = [_write("x"), *map(_write, "abcd"), _write("x")]  # x's value is dead by its next use
    empty = [([h], [1], [0]) if h == "x" else _write(h) for h in "xabcdx"]  # an empty tile: never evicted
    for step in (rewritten, empty):
        assert hints.plan(key, step, _PAGES) == hints.plan(key, step, _PAGES) == (0, [])


def test_hints_keep_a_bounded_number_of_batch_layouts():
    hints = Hints(limit=3 * PAGE)
    step = [_read("x"), *map(_write, "abcd"), _read("x")]
    key = hints.key("step")
    hints.plan(key, step, _PAGES)
    assert hints.plan(key, step, _PAGES) == (1, [0, 1, 0])
    for i in range(300):  # a program whose batches never repeat: what was learned goes, memory stays bounded
        hints.plan(hints.key(("other", i)), [_read("y")], _PAGES)
    assert len(hints._keys) <= 256 and len(hints._evict) <= 256
    key = hints.key("step")
    assert hints.plan(key, step, _PAGES) == (0, [])  # learned anew
    assert hints.plan(key, step, _PAGES) == (1, [0, 1, 0])
