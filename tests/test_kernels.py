"""Tile kernels are data: a step recorded twice lowers to equal kernels, and the
lowering refuses closures."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_nntile
from torch_nntile.kernels import CpuScalar, Kernel
from torch_nntile.nn.model import DeepReLU
from torch_nntile.session import SESSION_STATE
from torch_nntile.tiling.tiles import Arg, Lowering, W


def _lowered_kernels() -> list[tuple[object, str]]:
    torch_nntile.compile_graph()
    ctx = SESSION_STATE.compiled
    out = [(t[0], t[4]) for t in ctx.tasks]
    torch_nntile.run()
    torch_nntile.wait()
    return out


def test_a_step_recorded_twice_lowers_to_equal_kernels(monkeypatch):
    monkeypatch.setattr(SESSION_STATE, "thread_flush_ops", 1 << 30)  # the whole step in one compile
    torch.manual_seed(0)
    model = DeepReLU(16, 32, 5, depth=3).to("nntile")
    x = torch.randn(24, 16).to("nntile")
    y = torch.randint(0, 5, (24,)).to("nntile")
    torch_nntile.set_axis_group_name(x, {0: "batch_k"})
    torch_nntile.set_axis_group_tiling("batch_k", [10, 14])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> list[tuple[object, str]]:
        loss = F.cross_entropy(model(x), y) + (model[0].weight ** 2).mean() * 1e-3
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return _lowered_kernels()

    step()  # the first step makes AdamW's state
    second, third = step(), step()
    names = {part for _, name in second for part in name.split("+")}  # fused chains are named a+b+...
    assert {"mm", "add", "addcdiv"} <= names, names
    # AdamW's step counter and bias corrections are numbers baked into some kernels:
    # they change from step to step. Apart from such numbers every kernel is equal.
    assert len(second) == len(third)
    assert [(_structure(a), n) for a, n in second] == [(_structure(a), n) for a, n in third]
    differ = sum(a != b for (a, _), (b, _) in zip(second, third))
    assert 0 < differ < len(second) // 4


def _structure(k: object) -> object:
    """A kernel with its numeric parameters blanked out."""
    def blank(v: object) -> object:
        if isinstance(v, (int, float, CpuScalar)) and not isinstance(v, bool):
            return "#"
        if isinstance(v, Kernel):  # a fused chain's steps
            return (v.fn, blank(v.params))
        return tuple(blank(x) for x in v) if isinstance(v, tuple) else v
    return blank(k) if isinstance(k, Kernel) else k


def test_closures_are_refused():
    rt = SESSION_STATE.runtime()
    ctx = Lowering(rt)
    arr = ctx.temp((4,), torch.float32)
    with pytest.raises(TypeError, match="kernels are Kernel, Gemm or PackB data"):
        ctx.task(lambda o: o.zero_(), [Arg(arr, (0,), W)], "closure")
    ctx.discard()


def test_kernel_equality_tells_negative_zero_and_nested_kernels_apart():
    add = torch.add
    assert Kernel(add, 1.0, (2, 3)) == Kernel(add, 1.0, (2, 3))
    assert Kernel(add, 1.0) != Kernel(add, 2.0)
    assert Kernel(add, 0.0) != Kernel(add, -0.0)  # == alone would call them equal
    assert Kernel(add, (0.0, 1)) != Kernel(add, (-0.0, 1))
    inner, inner_neg = Kernel(torch.mul, 0.0), Kernel(torch.mul, -0.0)
    assert Kernel(add, inner) != Kernel(add, inner_neg)
    assert Kernel(add, inner) == Kernel(add, Kernel(torch.mul, 0.0))
    assert Kernel(add, 1.0) != Kernel(torch.mul, 1.0)
    a, b = Kernel(add, -0.0, 2), Kernel(add, -0.0, 2)
    assert a == b and hash(a) == hash(b)
    assert Kernel(add, 1) != Kernel(add, 1.0) != Kernel(add, True) != Kernel(add, 1)  # x == 1.0 compares in float
    assert Kernel(add, (None, 2)) != Kernel(add, (None, 2.0))
