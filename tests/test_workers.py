"""Worker counts: the default is every core, and more workers than cores (8 here, on a
2-core machine) give CPU's numbers. Each case runs in its own process: the suite's
context has 2 workers."""

from __future__ import annotations

import json
import os

from conftest import run_python

_EIGHT = """
import json, os
import torch, torch.nn as nn, torch.nn.functional as F
import torch_nntile
from torch_nntile.session import SESSION_STATE

torch_nntile.init_context(ncpu=8)
res = {"ncpu": SESSION_STATE.runtime().ncpu}
torch.manual_seed(0)
cpu = nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.Linear(96, 7))
dev = nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.Linear(96, 7))
dev.load_state_dict(cpu.state_dict())
dev.to("nntile")
x, y = torch.randn(200, 48), torch.randint(0, 7, (200,))
xd, yd = x.to("nntile"), y.to("nntile")
torch_nntile.set_axis_group_name(xd, {0: "batch", 1: "features"})
torch_nntile.set_axis_group_tiling("batch", [32] * 6 + [4, 4])  # 8 tiles, uneven
torch_nntile.set_axis_group_tiling("features", 16)
opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu, dev)]
res["losses"] = []
for _ in range(4):
    pair = []
    for m, opt, a, b in ((cpu, opts[0], x, y), (dev, opts[1], xd, yd)):
        loss = F.cross_entropy(m(a), b)
        loss.backward()
        opt.step()
        opt.zero_grad()
        pair.append(loss.item())
    res["losses"].append(pair)
res["weights"] = max((p.cpu() - q).abs().max().item() for p, q in zip(dev.parameters(), cpu.parameters()))
print(json.dumps(res))
"""


def test_more_workers_than_cores_give_cpu_numbers():
    out = run_python(_EIGHT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.splitlines()[-1])
    assert res["ncpu"] == 8
    for cpu_loss, dev_loss in res["losses"]:
        assert abs(cpu_loss - dev_loss) <= 1e-5 * abs(cpu_loss)
    assert res["weights"] < 1e-5


def test_default_is_one_worker_per_core():
    out = run_python("import torch_nntile\nfrom torch_nntile.session import SESSION_STATE\n"
                     "torch_nntile.init_context()\nprint(SESSION_STATE.runtime().ncpu)\n", timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.splitlines()[-1]) == len(os.sched_getaffinity(0))
