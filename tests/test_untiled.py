"""Ops with no tiled lowering, run in the graph as untiled tasks (backend/untiled.py).

Behind ``TORCH_NNTILE_UNTILED=1`` for now, read when torch_nntile is imported: each run
is a subprocess. With ``cpu_fallback=False`` nothing may reach the host fallback; the
results are CPU's, untiled and with the batch in two tiles, for zero-size and 0-dim
inputs too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

_SCRIPT = """
import json, sys
import torch, torch.nn.functional as F
import torch_nntile
from torch_nntile import stats

torch_nntile.init_context(ncpu=2, cpu_fallback=False)
tiled = sys.argv[1] == "tiled"
res = {}

def dev(x, grad=False):
    d = x.detach().to("nntile").requires_grad_(grad)
    if tiled:
        name = f"b{len(res)}_{x.dim()}"
        torch_nntile.set_axis_group_name(d, {0: name})
        torch_nntile.set_axis_group_tiling(name, max(1, x.shape[0] // 2))
    return d

def diff(got, want):
    return float((got.detach().cpu() - want.detach()).abs().max()) if want.numel() else 0.0

torch.manual_seed(0)
x, w = torch.randn(4, 3, 8, 8), torch.randn(5, 3, 3, 3, requires_grad=True)
xn, wn = dev(x), dev(w, grad=True)
y, yn = F.conv2d(x, w, padding=1, stride=2), F.conv2d(xn, wn, padding=1, stride=2)
g = torch.randn(y.shape)
y.backward(g)
yn.backward(dev(g))
res["conv"] = [diff(yn, y), diff(wn.grad, w.grad)]
v, i = torch.topk(x.flatten(1), 5)
vn, i_n = torch.topk(xn.flatten(1), 5)
res["topk"] = [diff(vn, v), bool(torch.equal(i_n.cpu(), i))]
res["unfold"] = bool(torch.equal(xn.unfold(2, 3, 2).cpu(), x.unfold(2, 3, 2)))
p, pi = F.max_pool2d(x, 2, return_indices=True)
pn, pin = F.max_pool2d(xn, 2, return_indices=True)
res["max_pool2d"] = [diff(pn, p), bool(torch.equal(pin.cpu(), pi))]
res["histc"] = bool(torch.equal(torch.histc(xn, 10).cpu(), torch.histc(x, 10)))
c, cn = x.abs() + 0.5, dev(x.abs() + 0.5)
c.digamma_()
cn.digamma_()  # in place (through digamma.out into self): the argument gets the new value
res["digamma_"] = diff(cn, c)
o, on = torch.empty(0), dev(torch.empty(0))
torch.polygamma(1, x, out=o)
out = torch.polygamma(1, xn, out=on)  # out=: resized, written, returned
res["polygamma_out"] = [diff(on, o) / float(o.abs().max()), out is on, list(on.shape)]
e = torch.empty(0, 3)
res["histc_empty"] = bool(torch.equal(torch.histc(dev(e), 4).cpu(), torch.histc(e, 4)))  # zero-size
s0 = torch.tensor(2.5)
v0, i0 = torch.topk(s0.to("nntile"), 1)  # 0-dim
res["topk_0dim"] = [v0.item(), i0.item(), list(v0.shape), list(i0.shape)]
try:
    torch.logcumsumexp(xn, 0)  # no Meta kernel: the host fallback, refused here
except NotImplementedError as e:
    res["logcumsumexp"] = str(e)
res["untiled"] = sorted(stats.UNTILED_CALLS)
res["fallback"] = sorted(stats.FALLBACK_CALLS)
print(json.dumps(res))
"""


def _run(layout: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_SCRIPT), layout], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TORCH_NNTILE_UNTILED": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_ops_without_tiled_lowering_run_in_the_graph():
    for layout in ("untiled", "tiled"):
        res = _run(layout)
        conv_out, conv_grad = res["conv"]
        assert conv_out < 1e-5 and conv_grad < 1e-4, res
        assert res["topk"] == [0.0, True] and res["unfold"] and res["histc"], res
        assert res["max_pool2d"] == [0.0, True], res
        assert res["histc_empty"] and res["topk_0dim"] == [2.5, 0, [], []], res
        assert res["digamma_"] < 1e-5, res
        assert res["polygamma_out"][0] < 1e-5 and res["polygamma_out"][1:] == [True, [4, 3, 8, 8]], res
        assert res["logcumsumexp"].startswith("torch_nntile: aten::_logcumsumexp is not supported on the nntile "), res
        assert {"aten::convolution_overrideable", "aten::convolution_backward_overrideable", "aten::topk.values",
                "aten::unfold", "aten::max_pool2d_with_indices.out", "aten::histc", "aten::digamma.out",
                "aten::polygamma.out"} <= set(res["untiled"]), res
        assert res["fallback"] == [], res
