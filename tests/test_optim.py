"""torch.optim optimizers on nntile parameters match the same optimizer on CPU step by
step, natively (no CPU fallback); plus the elementwise and ``_foreach_*`` ops they use."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from conftest import RTOL, assert_close, check_op, rel_err
from torch import nn

import torch_nntile

torch.manual_seed(0)
A = torch.randn(12, 10)
B = torch.randn(12, 10)
ROW = torch.randn(10)
TILES = [None, {(0, 0): [5, 4, 3], (0, 1): 5}]
TILE_IDS = ["untiled", "tiled"]

NEW_ELEMENTWISE = {
    "maximum": (torch.maximum, [A, B]),
    "minimum_row": (torch.minimum, [A, ROW]),
    "maximum_cpu_scalar": (lambda a: torch.maximum(a, torch.tensor(0.25)), [A]),
    "clamp": (lambda a: torch.clamp(a, -0.5, 0.75), [A]),
    "clamp_min_only": (lambda a: torch.clamp(a, min=-0.1), [A]),
    "clamp_tensor": (lambda a, b: torch.clamp(a, min=b, max=b + 1), [A, B]),
    "clamp_tensor_max_only": (lambda a, r: torch.clamp(a, max=r), [A, ROW]),
    "clamp_tensor_cpu_min": (lambda a: torch.clamp(a, min=torch.tensor(-0.2)), [A]),
    "clamp_min": (lambda a: torch.clamp_min(a, 0.3), [A]),
    "clamp_max_tensor": (lambda a, r: torch.clamp_max(a, r), [A, ROW]),
    "lerp_tensor": (lambda a, b, w: torch.lerp(a, b, w.sigmoid()), [A, B, ROW]),
    "lerp_cpu_weight": (lambda a, b: torch.lerp(a, b, torch.tensor(0.3)), [A, B]),
    "pow_scalar_base": (lambda a: torch.pow(2.0, a), [A]),
    "square": (torch.square, [A]),
    # what the backward of the ops above and of sigmoid / tanh asks for
    "masked_fill": (lambda a: a.masked_fill(a > 0.5, 2.0), [A]),
    "masked_fill_cpu_value": (lambda a: a.masked_fill(a < 0, torch.tensor(-1.0)), [A]),
    "masked_fill_row_mask": (lambda a, m: a.masked_fill(m, 0.0), [A, ROW > 0]),
    "logical": (lambda a, b: torch.where(torch.logical_or(torch.logical_and(a > 0, torch.logical_not(b > 0)),
                                                          torch.logical_xor(a > 1, b < 0)),
                                         a, b), [A, B]),
    "sigmoid": (torch.sigmoid, [A]),
    "tanh": (torch.tanh, [A]),
}


@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("name", list(NEW_ELEMENTWISE))
def test_optimizer_elementwise_ops(name, tiles):
    fn, inputs = NEW_ELEMENTWISE[name]
    check_op(fn, inputs, tiles)


def test_inplace_and_out_forms():
    """The forms defop's naming rule does not derive: pow_, clamp.Tensor_out, lerp.Tensor_out."""
    a, b = A.to("nntile"), B.to("nntile")
    assert_close(a.clone().pow_(2).cpu(), A.pow(2))
    assert_close(a.abs().pow_(b).cpu(), A.abs().pow(B))
    out = torch.empty(12, 10, device="nntile")
    torch.clamp(a, min=b, max=b + 1, out=out)
    assert_close(out.cpu(), torch.clamp(A, min=B, max=B + 1))
    torch.lerp(a, b, b.sigmoid(), out=out)
    assert_close(out.cpu(), torch.lerp(A, B, B.sigmoid()))
    torch.maximum(a, b, out=out)
    assert_close(out.cpu(), torch.maximum(A, B))
    empty = torch.empty(0, device="nntile")
    torch.clamp(a, min=b, out=empty)  # an out= tensor of zero elements is resized, as on CPU
    assert_close(empty.cpu(), torch.clamp(A, min=B))
    c = a.clone()
    c.clamp_(-0.2, 0.2)
    assert_close(c.cpu(), A.clamp(-0.2, 0.2))
    c.masked_fill_(c > 0.1, 5.0)
    assert_close(c.cpu(), A.clamp(-0.2, 0.2).masked_fill(A.clamp(-0.2, 0.2) > 0.1, 5.0))
    g = torch.empty(12, 10, device="nntile")
    torch.ops.aten.sigmoid_backward.grad_input(b, a, grad_input=g)
    assert_close(g.cpu(), torch.ops.aten.sigmoid_backward(B, A))
    with pytest.raises(RuntimeError, match="boolean masks"):
        a.masked_fill(b, 1.0)
    with pytest.raises(RuntimeError, match="At least one of 'min' or 'max'"):
        torch.clamp(a)


# -- _foreach_* overloads ---------------------------------------------------------

SHAPES = [(12, 10), (10,), (3, 4, 5)]


def _lists(k: int) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
    """``k`` lists of CPU tensors (positive, so that sqrt / pow / div stay finite) and their nntile copies."""
    g = torch.Generator().manual_seed(k)
    cpu = [[torch.rand(s, generator=g) + 0.5 for s in SHAPES] for _ in range(k)]
    return cpu, [[t.to("nntile") for t in lst] for lst in cpu]


FOREACH = {
    "addcmul_Scalar": lambda s, a, b: torch._foreach_addcmul_(s, a, b, value=-0.5),
    "addcmul_ScalarList": lambda s, a, b: torch._foreach_addcmul_(s, a, b, [0.5, -1.0, 2.0]),
    "addcmul_Tensor": lambda s, a, b: torch._foreach_addcmul_(s, a, b, torch.tensor([0.5, -1.0, 2.0])),
    "addcdiv_ScalarList": lambda s, a, b: torch._foreach_addcdiv_(s, a, b, [0.5, -1.0, 2.0]),
    "addcdiv_Tensor": lambda s, a, b: torch._foreach_addcdiv_(s, a, b, torch.tensor([0.5, -1.0, 2.0])),
    "addcmul": lambda s, a, b: torch._foreach_addcmul(s, a, b, value=2),
    "maximum_List": lambda s, a, b: torch._foreach_maximum_(s, a),
    "maximum_Scalar": lambda s, a, b: torch._foreach_maximum_(s, 0.9),
    "minimum_ScalarList": lambda s, a, b: torch._foreach_minimum(s, [0.6, 0.9, 1.2]),
    "clamp_min_List": lambda s, a, b: torch._foreach_clamp_min(s, b),
    "pow_Scalar": lambda s, a, b: torch._foreach_pow(s, 0.5),
    "pow_List": lambda s, a, b: torch._foreach_pow_(s, a),
    "pow_ScalarAndTensor": lambda s, a, b: torch._foreach_pow(0.9, s),
    "lerp_Scalar": lambda s, a, b: torch._foreach_lerp_(s, a, 0.1),
    "lerp_List": lambda s, a, b: torch._foreach_lerp_(s, a, b),
    "lerp_ScalarList": lambda s, a, b: torch._foreach_lerp(s, a, [0.1, 0.5, 0.9]),
    "div_Tensor_cpu0d": lambda s, a, b: torch._foreach_div_(s, torch.tensor(3.0)),
    "add_List_alpha": lambda s, a, b: torch._foreach_add_(s, a, alpha=-0.5),
    "sub_ScalarList": lambda s, a, b: torch._foreach_sub(s, [1, 2, 3]),
    "sqrt": lambda s, a, b: torch._foreach_sqrt(s),
    "reciprocal_": lambda s, a, b: torch._foreach_reciprocal_(s),
    "exp_": lambda s, a, b: torch._foreach_exp_(s),
    "copy_": lambda s, a, b: torch._foreach_copy_(s, b),
    "zero_": lambda s, a, b: torch._foreach_zero_(s),
}
if hasattr(torch, "_foreach_clone"):  # torch 2.11 has no _foreach_clone
    FOREACH["clone"] = lambda s, a, b: torch._foreach_clone(s)


@pytest.mark.parametrize("name", list(FOREACH))
def test_foreach(name):
    fn = FOREACH[name]
    (cs, ca, cb), (ns, na, nb) = _lists(3)
    want = fn(cs, ca, cb)
    got = fn(ns, na, nb)
    assert (want is None) == (got is None)
    for w, g in zip(want if want is not None else cs, got if got is not None else ns):
        assert g.device.type == "nntile"
        assert_close(g.cpu(), w)


def test_foreach_length_mismatch_raises():
    _, (ns, na, _) = _lists(3)
    with pytest.raises(RuntimeError, match="same number of tensors"):
        torch._foreach_add_(ns, na[:2])


# The per-element contract of a foreach call: each element's result, dtype and error as
# the element op on CPU gives them (the fast path runs the element ops' functional forms).

def _mixed() -> list[torch.Tensor]:
    """Elements whose dtypes, ranks and sizes differ: float32, float64, 0-dim, zero-size, broadcastable."""
    g = torch.Generator().manual_seed(11)
    return [torch.rand(4, 3, generator=g) + 0.5, (torch.rand(5, generator=g) + 0.5).double(), torch.tensor(1.5),
            torch.rand(0, 3, generator=g), torch.rand(1, 3, generator=g) + 0.5]


FOREACH_MIXED = {
    "mul_Scalar": lambda s, o: torch._foreach_mul(s, 0.5),
    "mul__Scalar": lambda s, o: torch._foreach_mul_(s, 0.5),
    "mul__ScalarList": lambda s, o: torch._foreach_mul_(s, [0.5, 2, -1.0, 3.0, True]),
    "mul_Tensor_cpu0d": lambda s, o: torch._foreach_mul(s, torch.tensor(2.0, dtype=torch.float64)),
    "mul__Tensor_nntile0d": lambda s, o: torch._foreach_mul_(s, torch.tensor(2.0).to(s[0].device)),
    "add_List": lambda s, o: torch._foreach_add(s, o),
    "add__List_alpha": lambda s, o: torch._foreach_add_(s, o, alpha=2),
    "add__Scalar": lambda s, o: torch._foreach_add_(s, 1),
    "add_Tensor_alpha": lambda s, o: torch._foreach_add(s, torch.tensor(2.0), alpha=0.5),
    "sub__ScalarList": lambda s, o: torch._foreach_sub_(s, [1, 2.5, 3, 4, 5]),
    "div__ScalarList": lambda s, o: torch._foreach_div_(s, [2.0, 4.0, 0.5, 1.0, 3.0]),
    "div_List": lambda s, o: torch._foreach_div(s, o),
    "addcmul__Scalar": lambda s, o: torch._foreach_addcmul_(s, o, s, 0.5),
    "addcmul_Tensor": lambda s, o: torch._foreach_addcmul(s, o, o, torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])),
    "addcdiv__ScalarList": lambda s, o: torch._foreach_addcdiv_(s, o, s, [0.1, 0.2, 0.3, 0.4, 0.5]),
    "lerp__Scalar": lambda s, o: torch._foreach_lerp_(s, [t.to(x.dtype) for t, x in zip(o, s)], 0.1),
    "sqrt": lambda s, o: torch._foreach_sqrt(s),
    "sqrt_": lambda s, o: torch._foreach_sqrt_(s),
    "maximum__Scalar": lambda s, o: torch._foreach_maximum_(s, 1.0),
    "pow_ScalarAndTensor": lambda s, o: torch._foreach_pow(2.0, s),
}


def _run_both(fn, make):
    """``fn`` on CPU lists and on their nntile copies: (result or error, lists after) each."""
    outcome = []
    for dev in ("cpu", "nntile"):
        lists = [[t.to(dev) if dev != "cpu" else t.clone() for t in lst] for lst in make()]
        try:
            out = fn(*lists)
            got = None if out is None else [t.cpu() for t in out]
        except RuntimeError as e:
            got = e
        outcome.append((got, [[t.cpu() for t in lst] for lst in lists]))
    return outcome


def _assert_same_outcome(fn, make):
    (want, want_lists), (got, got_lists) = _run_both(fn, make)
    if isinstance(want, RuntimeError):
        assert isinstance(got, RuntimeError), f"CPU raised {want!r}, nntile returned"
        assert str(got) == str(want)
    else:
        assert not isinstance(got, RuntimeError), f"nntile raised {got!r}, CPU did not"
        assert (want is None) == (got is None)
        assert len(got or []) == len(want or [])
        for w, g in zip(want or [], got or []):
            assert_close(g, w)
    for wl, gl in zip(want_lists, got_lists):  # in-place results, and what an error left behind
        for w, g in zip(wl, gl):
            assert_close(g, w)


@pytest.mark.parametrize("name", list(FOREACH_MIXED))
def test_foreach_mixed_elements_match_cpu(name):
    """Per element: type promotion, in-place dtype checks, broadcasting, 0-dim and zero-size tensors."""
    fn = FOREACH_MIXED[name]
    _assert_same_outcome(fn, lambda: [_mixed(), [t.flip(0) if t.dim() else t + 1 for t in _mixed()]])


@pytest.mark.parametrize("name", ["mul_Scalar", "mul__Scalar", "mul__ScalarList", "add__Scalar", "add_List",
                                  "div_List", "sqrt", "sqrt_", "sub__ScalarList", "addcmul__Scalar",
                                  "mul__Tensor_nntile0d"])
def test_foreach_integer_elements_match_cpu(name):
    """Integer elements: out-of-place ops promote to float; in place, a float result raises
    (after the elements before it were updated, as on CPU)."""
    g = torch.Generator().manual_seed(13)
    f = [torch.rand(3, generator=g) + 0.5, torch.rand((), generator=g) + 0.5]
    ints = [torch.arange(1, 7).reshape(2, 3), torch.tensor(3), torch.arange(1, 5, dtype=torch.int32)]
    others = [torch.ones(3), torch.full((2, 3), 2.0), torch.tensor(2), torch.ones(()), torch.full((4,), 2, dtype=torch.int32)]
    _assert_same_outcome(FOREACH_MIXED[name], lambda: [[f[0], ints[0], ints[1], f[1], ints[2]], others])


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_foreach_inplace_cast_error_matches_cpu(dtype):
    ints = [torch.ones(3, dtype=dtype)]
    for fn in (lambda s: torch._foreach_mul_(s, 0.5), lambda s: torch._foreach_add_(s, [t.float() for t in s]),
               lambda s: torch._foreach_div_(s, 2)):
        (want, _), (got, _) = _run_both(fn, lambda: [ints])
        assert isinstance(want, RuntimeError) and isinstance(got, RuntimeError)
        assert str(got) == str(want)


@pytest.mark.parametrize("call", [
    lambda s, o: torch._foreach_add_(s, o[:2]),
    lambda s, o: torch._foreach_add(s, o + o[:1]),
    lambda s, o: torch._foreach_lerp_(s, o[:2], 0.5),
    lambda s, o: torch._foreach_addcmul_(s, o, o[:1], 0.5),
    lambda s, o: torch._foreach_add_(s, [1.0, 2.0]),
    lambda s, o: torch._foreach_mul(s, [1.0, 2.0, 3.0, 4.0]),
    lambda s, o: torch._foreach_addcdiv_(s, o, o, [0.5]),
    lambda s, o: torch._foreach_addcmul_(s, o, o, torch.tensor([1.0, 2.0])),
], ids=["List", "List_longer", "lerp", "addcmul_tensor2", "ScalarList", "ScalarList_longer", "addcdiv_ScalarList",
        "addcmul_scalars"])
def test_foreach_length_mismatch_matches_cpu(call):
    (want, wl), (got, gl) = _run_both(call, lambda: [[torch.full((3,), i + 1.0) for i in range(3)], [torch.full((3,), 2.0)] * 3])
    assert isinstance(want, RuntimeError) and isinstance(got, RuntimeError)
    assert str(got) == str(want)
    for w, g in zip(wl[0], gl[0]):  # nothing was updated
        assert_close(g, w)


def test_foreach_counts_the_element_ops():
    """A foreach call counts itself once and its element op once per element."""
    _, (ns, na, _) = _lists(3)
    torch_nntile.reset_info()
    torch._foreach_addcdiv_(ns, na, na, [0.1, 0.2, 0.3])
    torch._foreach_sqrt(ns)
    assert torch_nntile.metrics()["ops"] == {"aten::_foreach_addcdiv_.ScalarList": 1, "aten::addcdiv_": 3,
                                             "aten::_foreach_sqrt": 1, "aten::sqrt": 3}


def test_foreach_element_declined_runs_on_fallback(monkeypatch):
    """An element whose form declines (NotNative) runs as an untiled task, the others natively."""
    from torch_nntile.backend import table_elementwise
    from torch_nntile.ops.base import NotNative

    ew = table_elementwise.ew

    def picky(name, fn, args, dtype, **kw):
        if name == "mul" and isinstance(args[0], torch.Tensor) and args[0].dim() == 1:
            raise NotNative("a 1-D operand (test)")
        return ew(name, fn, args, dtype, **kw)

    monkeypatch.setattr(table_elementwise, "ew", picky)
    (cs, _, _), (ns, _, _) = _lists(3)
    torch_nntile.reset_info()
    torch._foreach_mul_(ns, 3.0)
    outs = torch._foreach_mul(ns, [2.0, 0.5, 4])
    torch._foreach_mul_(cs, 3.0)
    want = torch._foreach_mul(cs, [2.0, 0.5, 4])
    for lst, ref in ((ns, cs), (outs, want)):
        for g, w in zip(lst, ref):
            assert g.device.type == "nntile"
            assert_close(g.cpu(), w)
    assert torch_nntile.fallback_counts() == {}
    assert {k: v["count"] for k, v in torch_nntile.metrics()["untiled"].items()} == {"aten::mul_.Scalar": 1,
                                                                                    "aten::mul.Scalar": 1}
    ops = torch_nntile.metrics()["ops"]
    assert ops["aten::mul_.Scalar"] == 3 and ops["aten::mul.Scalar"] == 3  # 2 native + 1 untiled each
    torch_nntile.init_context(ncpu=2, tiled_only=True)
    try:
        with pytest.raises(NotImplementedError, match=r"aten::mul_.Scalar has no tiled kernel .*1-D operand \(test\)"):
            torch._foreach_mul_(ns, 3.0)
    finally:
        torch_nntile.init_context(ncpu=2)


def test_adamw_foreach_mixed_params_match_cpu():
    """AdamW's foreach path over float32 / float64 / 0-dim / zero-size parameters."""
    g = torch.Generator().manual_seed(7)
    init = [torch.randn(6, 4, generator=g), torch.randn(5, generator=g).double(), torch.randn((), generator=g),
            torch.randn(0, 3, generator=g), torch.randn(3, generator=g)]
    ref = [nn.Parameter(t.clone()) for t in init]
    mine = [nn.Parameter(t.to("nntile")) for t in init]
    kw = dict(lr=0.05, weight_decay=0.1, foreach=True)
    opt, ref_opt = torch.optim.AdamW(mine, **kw), torch.optim.AdamW(ref, **kw)
    for _ in range(4):
        for p, q in zip(mine, ref):
            q.grad = torch.randn(q.shape, generator=g, dtype=q.dtype)
            p.grad = q.grad.to("nntile")
        opt.step()
        ref_opt.step()
        for p, q in zip(mine, ref):
            assert_close(p.detach().cpu(), q.detach())


# -- optimizers -------------------------------------------------------------------

OPTIMIZERS = {
    "sgd": ("SGD", dict(lr=0.1)),
    "sgd_momentum_wd": ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01, foreach=False)),
    "sgd_nesterov_foreach": ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=True)),
    "sgd_dampening_maximize": ("SGD", dict(lr=0.05, momentum=0.5, dampening=0.1, maximize=True)),
    "adam": ("Adam", dict(lr=0.01, foreach=False)),
    "adam_foreach": ("Adam", dict(lr=0.01, foreach=True)),
    "adam_amsgrad_wd": ("Adam", dict(lr=0.01, amsgrad=True, weight_decay=0.01, foreach=False)),
    "adam_amsgrad_foreach": ("Adam", dict(lr=0.01, amsgrad=True, weight_decay=0.01, foreach=True)),
    "adamw": ("AdamW", dict(lr=0.01, foreach=False)),
    "adamw_foreach": ("AdamW", dict(lr=0.01, foreach=True)),
    "adamw_amsgrad": ("AdamW", dict(lr=0.01, amsgrad=True, foreach=False)),
    "adamw_amsgrad_foreach_maximize": ("AdamW", dict(lr=0.01, amsgrad=True, foreach=True, maximize=True)),
    "rmsprop": ("RMSprop", dict(lr=0.01, foreach=False)),
    "rmsprop_foreach": ("RMSprop", dict(lr=0.01, foreach=True)),
    # centered RMSprop's first steps are near sign descent: at lr=0.01 the sign of near-zero gradient
    # entries, set by summation order, moves CPU itself by 1.6e-5 between two batch splits
    "rmsprop_centered_momentum": ("RMSprop", dict(lr=0.001, momentum=0.9, centered=True, weight_decay=0.01,
                                                  foreach=False)),
    "rmsprop_centered_momentum_foreach": ("RMSprop", dict(lr=0.001, momentum=0.9, centered=True, weight_decay=0.01,
                                                          foreach=True)),
    "adam_fused": ("Adam", dict(lr=0.01, fused=True)),
    "adam_fused_wd_maximize": ("Adam", dict(lr=0.01, weight_decay=0.05, maximize=True, fused=True)),
    "adamw_fused": ("AdamW", dict(lr=0.01, fused=True)),
    "adamw_fused_amsgrad_maximize": ("AdamW", dict(lr=0.01, amsgrad=True, maximize=True, weight_decay=0.05,
                                                   fused=True)),
    "adagrad": ("Adagrad", dict(lr=0.1, foreach=False)),
    "adagrad_foreach": ("Adagrad", dict(lr=0.1, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1,
                                        foreach=True)),
}
BATCH_TILING = [None, [16, 20, 12]]
BATCH_IDS = ["untiled", "tiled"]


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))


def _data(tiling: list[int] | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(48, 16, generator=g), torch.randint(0, 8, (48,), generator=g)
    xn, yn = x.to("nntile"), y.to("nntile")
    torch_nntile.set_axis_group_name(xn, {0: "batch"})
    if tiling is not None:
        torch_nntile.set_axis_group_tiling("batch", tiling)
    return x, y, xn, yn


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    F.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _assert_params_close(model: nn.Module, ref: nn.Module, what: str) -> None:
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.device.type == "nntile"
        err = rel_err(p.detach().cpu(), q.detach())
        assert err <= RTOL, f"{what}: {name} relative error {err:.3g} > {RTOL}"


@pytest.mark.parametrize("tiling", BATCH_TILING, ids=BATCH_IDS)
@pytest.mark.parametrize("config", list(OPTIMIZERS))
def test_optimizer_matches_cpu(config, tiling):
    cls_name, kw = OPTIMIZERS[config]
    cls = getattr(torch.optim, cls_name)
    ref = _model()
    model = copy.deepcopy(ref).to("nntile")
    x, y, xn, yn = _data(tiling)
    opt, ref_opt = cls(model.parameters(), **kw), cls(ref.parameters(), **kw)
    start = [q.detach().clone() for q in ref.parameters()]
    for step in range(10):
        _step(model, opt, xn, yn)
        _step(ref, ref_opt, x, y)
        _assert_params_close(model, ref, f"step {step + 1}")
    assert any(rel_err(q.detach(), s) > 1e-3 for q, s in zip(ref.parameters(), start)), "parameters did not move"
    for p in model.parameters():
        for key, v in opt.state[p].items():
            if isinstance(v, torch.Tensor):
                # the step count stays on the CPU (non-capturable, non-fused optimizers); the moments live on nntile
                on_cpu = key == "step" and not kw.get("fused")
                assert v.device.type == ("cpu" if on_cpu else "nntile"), (key, v.device)


@pytest.mark.parametrize("config", ["sgd_momentum_wd", "adamw_amsgrad_foreach_maximize", "rmsprop_centered_momentum",
                                    "adagrad"])
def test_state_dict_round_trip_continues_training(config):
    """Save model and optimizer after 5 steps, load them into fresh nntile parameters and a
    fresh optimizer, train 5 more: the same as 10 uninterrupted steps on CPU."""
    cls_name, kw = OPTIMIZERS[config]
    cls = getattr(torch.optim, cls_name)
    ref = _model()
    model = copy.deepcopy(ref).to("nntile")
    x, y, xn, yn = _data([16, 32])
    opt, ref_opt = cls(model.parameters(), **kw), cls(ref.parameters(), **kw)
    for _ in range(5):
        _step(model, opt, xn, yn)
        _step(ref, ref_opt, x, y)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    del model, opt
    buf.seek(0)
    saved = torch.load(buf)
    assert all(v.device.type == "nntile" for v in saved["model"].values())
    model2 = _model().to("nntile")  # fresh parameters, other values until loaded
    model2.load_state_dict(saved["model"])
    opt2 = cls(model2.parameters(), **kw)
    opt2.load_state_dict(saved["opt"])
    for p, q in zip(model2.parameters(), ref.parameters()):
        for key, v in ref_opt.state[q].items():
            got = opt2.state[p][key]
            if isinstance(v, torch.Tensor):
                assert got.device.type == ("cpu" if key == "step" else "nntile"), (key, got.device)
                assert_close(got.cpu(), v)
    for step in range(5):
        _step(model2, opt2, xn, yn)
        _step(ref, ref_opt, x, y)
        _assert_params_close(model2, ref, f"step {step + 6}")


@pytest.mark.parametrize("foreach", [False, True], ids=["for_loop", "foreach"])
def test_capturable_adamw_counts_steps_on_device(foreach):
    """capturable=True keeps ``step`` on nntile and computes the bias corrections there
    (``_foreach_pow`` of a scalar base, ...); CPU cannot run that mode, so the
    reference is the ordinary one."""
    ref = _model()
    model = copy.deepcopy(ref).to("nntile")
    x, y, xn, yn = _data([16, 32])
    kw = dict(lr=0.01, amsgrad=True, weight_decay=0.01, foreach=foreach)
    opt, ref_opt = torch.optim.AdamW(model.parameters(), capturable=True, **kw), torch.optim.AdamW(ref.parameters(), **kw)
    for step in range(5):
        _step(model, opt, xn, yn)
        _step(ref, ref_opt, x, y)
        _assert_params_close(model, ref, f"step {step + 1}")
    steps = [opt.state[p]["step"] for p in model.parameters()]
    assert all(s.device.type == "nntile" and s.item() == 5 for s in steps)


# -- alike elements: one graph op per foreach call ------------------------------------

def _foreach_ops() -> list[str]:
    """The pending ``foreach`` graph ops, by label (the probes the calls leave are maps)."""
    from torch_nntile.graph.nodes import SESSION
    return [op.label for op in SESSION.snapshot() if op.opdef.name == "foreach"]


ALIKE = {  # (call, elements per list): 2-D elements of several shapes, one zero-size, one broadcasting
    "mul__Scalar": lambda s, a, b: torch._foreach_mul_(s, 0.75),
    "add_List": lambda s, a, b: torch._foreach_add(s, b, alpha=-2),
    "addcdiv__ScalarList_equal": lambda s, a, b: torch._foreach_addcdiv_(s, a, a, [0.25] * len(s)),
    "addcmul__Scalar": lambda s, a, b: torch._foreach_addcmul_(s, a, b, value=-0.5),
    "lerp__Scalar": lambda s, a, b: torch._foreach_lerp_(s, a, 0.3),
    "sqrt": lambda s, a, b: torch._foreach_sqrt(s),
    "div__ScalarList_unequal": lambda s, a, b: torch._foreach_div_(s, [2.0, -0.5, 4.0, 0.5, 1.5][:len(s)]),
    "pow_ScalarAndTensor": lambda s, a, b: torch._foreach_pow(2.0, s),
}
ALIKE_SHAPES = [(6, 5), (4, 5), (6, 5), (0, 5), (6, 1)]  # b's last element broadcasts against s's (6, 5)


def _alike_lists(tiled: bool):
    g = torch.Generator().manual_seed(17)
    shapes = [ALIKE_SHAPES[:4], ALIKE_SHAPES[:4], ALIKE_SHAPES[:3] + [(0, 1)]]
    cpu = [[torch.rand(s, generator=g) + 0.5 for s in lst] for lst in shapes]
    dev = [[t.to("nntile") for t in lst] for lst in cpu]
    if tiled:  # uneven tiles along dim 0 of the (6, 5) elements
        for i, t in enumerate(dev[0][:3:2]):
            torch_nntile.set_axis_group_name(t, {0: f"alike_rows_{i}"})
            torch_nntile.set_axis_group_tiling(f"alike_rows_{i}", [4, 2])
    torch_nntile.execute()
    torch_nntile.wait()
    return cpu, dev


@pytest.mark.parametrize("tiled", [False, True], ids=TILE_IDS)
@pytest.mark.parametrize("name", list(ALIKE))
def test_foreach_alike_elements_match_cpu(name, tiled):
    fn = ALIKE[name]
    (cs, ca, cb), (ns, na, nb) = _alike_lists(tiled)
    want = fn(cs, ca, cb)
    got = fn(ns, na, nb)
    ops = _foreach_ops()
    if name.endswith("unequal"):
        assert ops == [], ops  # elements with scalars of their own: element by element
    else:
        assert ops and len(ops) <= 2, ops  # the alike elements: one op (per group of alike ones)
    assert (want is None) == (got is None)
    for w, g in zip(want if want is not None else cs, got if got is not None else ns):
        assert g.device.type == "nntile" and g.shape == w.shape
        assert_close(g.cpu(), w)


def test_foreach_alike_0_dim_elements_match_cpu():
    cs = [torch.tensor(float(i) + 0.5) for i in range(4)]
    ns = [t.to("nntile") for t in cs]
    torch._foreach_addcmul_(ns, ns, ns, value=0.5)
    assert _foreach_ops() == ["addcmul"]
    torch._foreach_addcmul_(cs, cs, cs, value=0.5)
    for w, g in zip(cs, ns):
        assert_close(g.cpu(), w)


def test_foreach_repeated_call_takes_the_learned_kernel():
    """A call whose elements have the signature of an earlier call's (an optimizer's next
    step) takes the kernel learned then: no probe op is recorded beside its ``foreach``
    op. Another scalar, or elements of another dtype, probe again. Values are CPU's."""
    from torch_nntile.backend import table_foreach
    table_foreach._PROBED.clear()  # kernels learned by earlier tests
    g = torch.Generator().manual_seed(19)
    cs = [torch.rand(3, 4, generator=g) + 0.5 for _ in range(3)]
    ci = [torch.arange(12).reshape(3, 4) + i for i in range(3)]
    ns, ni = [t.to("nntile") for t in cs], [t.to("nntile") for t in ci]
    pending = []
    for lists, scalar in ((ns, 0.75), (ns, 0.75), (ns, 0.5), (ni, 3), (ni, 3)):
        torch_nntile.execute()
        torch._foreach_mul_(lists, scalar)
        pending.append(torch_nntile.pending_op_names())
    assert pending == [["mul", "mul"], ["mul"], ["mul", "mul"], ["mul", "mul"], ["mul"]]
    for lists, scalar in ((cs, 0.75), (cs, 0.75), (cs, 0.5), (ci, 3), (ci, 3)):
        torch._foreach_mul_(lists, scalar)
    for w, got in zip(cs + ci, ns + ni):
        assert got.dtype == w.dtype
        assert_close(got.cpu(), w)


def test_foreach_broadcast_growing_an_element_raises_as_on_cpu():
    """In place, an element whose result outgrows it raises as on CPU, after the elements
    before it were updated."""
    def run(dev: bool):
        s = [torch.full((3, 4), 1.0), torch.full((1, 4), 2.0), torch.full((3, 4), 3.0)]
        o = [torch.full((3, 4), 0.5)] * 3
        if dev:
            s, o = [t.to("nntile") for t in s], [t.to("nntile") for t in o]
        with pytest.raises(RuntimeError) as e:
            torch._foreach_add_(s, o)
        return str(e.value), [t.cpu() for t in s]
    (want_msg, want), (got_msg, got) = run(False), run(True)
    assert got_msg == want_msg
    for w, g in zip(want, got):
        assert_close(g, w)


def test_foreach_chains_fold_element_by_element():
    """A chain of foreach calls whose intermediate results nothing else holds runs as one
    task per element (untiled); elements whose inputs alias (the first reads one tensor
    twice) need programs of their own, and their chain is left unfolded. Both are CPU's."""
    g = torch.Generator().manual_seed(18)
    xs = [torch.rand(5, 3, generator=g) for _ in range(4)]
    ys = [torch.rand(5, 3, generator=g) for _ in range(4)]
    for aliased in (False, True):
        ysa = [xs[0]] + ys[1:] if aliased else ys
        xn, yn = [t.to("nntile") for t in xs], [t.to("nntile") for t in ysa]
        if aliased:
            yn[0] = xn[0]
        torch_nntile.execute()
        torch_nntile.wait()
        torch_nntile.reset_info()
        out = torch._foreach_mul(xn, 2.0)
        torch._foreach_add_(out, yn)
        torch._foreach_sqrt_(out)
        torch_nntile.execute()
        torch_nntile.wait()
        tasks = torch_nntile.info()["tasks_submitted"]
        assert tasks == (12 if aliased else 4), tasks  # (kernel names can run out in a long session)
        for g_, x, y in zip(out, xs, ysa):
            assert_close(g_.cpu(), (x * 2 + y).sqrt())


def test_foreach_signed_zero_scalars_make_groups_of_their_own():
    xs = [torch.full((2, 3), 1.0 + i) for i in range(4)]
    scalars = [0.0, -0.0, 0.0, -0.0]
    got = torch._foreach_mul([t.to("nntile") for t in xs], scalars)
    assert sorted(_foreach_ops()) == ["mul", "mul"]
    for g, w in zip(got, torch._foreach_mul(xs, scalars)):
        assert torch.equal(torch.signbit(g.cpu()), torch.signbit(w))


@pytest.mark.parametrize("case", ["same_target_twice", "reads_another_target", "views_of_one_storage"])
def test_foreach_in_place_elements_sharing_storage_run_in_order_as_on_cpu(case):
    """In place, an element that reads or writes what an earlier one wrote sees that
    write, as CPU's element-by-element loop does."""
    def run(dev: bool):
        a, b = torch.ones(2, 3), torch.full((2, 3), 2.0)
        base = torch.arange(12.0).reshape(4, 3)
        if dev:
            a, b, base = a.to("nntile"), b.to("nntile"), base.to("nntile")
        if case == "same_target_twice":
            torch._foreach_mul_([a, a, b], 2.0)
        elif case == "reads_another_target":
            torch._foreach_add_([a, b], [b, a])
        else:
            torch._foreach_addcmul_([base[:2], base[2:]], [base[2:], base[:2]], [b, b], value=0.5)
        return [t.cpu() for t in (a, b, base)]
    for w, g in zip(run(False), run(True)):
        assert_close(g, w)
