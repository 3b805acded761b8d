"""torch_nntile.training.SGD / AdamW (one fused update op per parameter) against
torch.optim.SGD / AdamW on CPU: parameters and state step by step, on nntile (untiled and
tiled unevenly) and on CPU parameters; param groups, state_dict round trips with
torch.optim, LR schedulers, argument checks, and the op count of a step."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import RTOL, assert_close, rel_err
from torch import nn

import torch_nntile
from torch_nntile import training
from torch_nntile.training import SGD, AdamW

SHAPES = [(7, 5), (5,), (), (0, 3)]  # a matrix, a vector, a 0-dim and a zero-size parameter
LAYOUTS = ["cpu", "untiled", "tiled"]
STEPS = 10


def _init(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _params(init: list[torch.Tensor], layout: str) -> list[nn.Parameter]:
    """Parameters on ``layout``: the matrix and the vector tiled unevenly for "tiled"."""
    if layout == "cpu":
        return [nn.Parameter(t.clone()) for t in init]
    ps = [nn.Parameter(t.to("nntile")) for t in init]
    if layout == "tiled":
        torch_nntile.set_axis_group_name(ps[0], {0: "rows", 1: "cols"})
        torch_nntile.set_axis_group_name(ps[1], {0: "vec"})
        torch_nntile.set_axis_group_tiling("rows", [3, 4])
        torch_nntile.set_axis_group_tiling("cols", [2, 3])
        torch_nntile.set_axis_group_tiling("vec", 2)
    return ps


def _grads(step: int, like: list[torch.Tensor]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(t.shape, generator=g) for t in like]


def _set_grads(ps: list[nn.Parameter], grads: list[torch.Tensor]) -> None:
    for p, g in zip(ps, grads):
        p.grad = g.to(p.device)


def _assert_match(mine: torch.optim.Optimizer, ours: list[nn.Parameter], ref: torch.optim.Optimizer,
                  theirs: list[nn.Parameter], what: str) -> None:
    """Parameters and every state entry within RTOL of torch.optim's (same keys)."""
    for i, (p, q) in enumerate(zip(ours, theirs)):
        err = rel_err(p.detach().cpu(), q.detach())
        assert err <= RTOL, f"{what}: param {i} relative error {err:.3g}"
        got, want = mine.state.get(p, {}), ref.state.get(q, {})
        assert set(got) == set(want), (what, i, set(got), set(want))
        for key, w in want.items():
            v = got[key]
            if key == "step":
                assert v.device.type == "cpu" and v.dtype == w.dtype and v.item() == w.item(), (what, key)
            else:
                assert v.device == p.device, (what, key, v.device)
                assert_close(v.detach().cpu(), w)


def _step_both(mine: torch.optim.Optimizer, ours: list[nn.Parameter], ref: torch.optim.Optimizer,
               theirs: list[nn.Parameter], init: list[torch.Tensor], steps: range, label: str | None = None) -> None:
    """Steps of both optimizers on the same gradients; with ``label``, compared after each."""
    for step in steps:
        grads = _grads(step, init)
        _set_grads(ours, grads)
        _set_grads(theirs, grads)
        mine.step()
        ref.step()
        if label is not None:
            _assert_match(mine, ours, ref, theirs, f"{label}step {step + 1}")


def _run(cls: type, ref_cls: type, kw: dict, layout: str, steps: int = STEPS) -> None:
    init = _init()
    ours, theirs = _params(init, layout), _params(init, "cpu")
    mine, ref = cls(ours, **kw), ref_cls(theirs, **kw)
    _step_both(mine, ours, ref, theirs, init, range(steps), "")
    assert rel_err(theirs[0].detach(), init[0]) > 1e-3, "parameters did not move"


SGD_CONFIGS = {
    "plain": dict(lr=0.1),
    "momentum": dict(lr=0.1, momentum=0.9),
    "dampening": dict(lr=0.1, momentum=0.9, dampening=0.3),
    "nesterov_wd": dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05),
    "wd_maximize": dict(lr=0.05, weight_decay=0.1, maximize=True),
    "all_but_nesterov": dict(lr=0.05, momentum=0.5, dampening=0.1, weight_decay=0.01, maximize=True),
}
ADAMW_CONFIGS = {
    "default": dict(lr=0.01),
    "no_wd": dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.0),
    "amsgrad": dict(lr=0.01, amsgrad=True),
    "amsgrad_maximize_wd": dict(lr=0.02, amsgrad=True, weight_decay=0.1, eps=1e-2, maximize=True),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("config", list(SGD_CONFIGS))
def test_sgd_matches_torch(config, layout):
    _run(SGD, torch.optim.SGD, SGD_CONFIGS[config], layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("config", list(ADAMW_CONFIGS))
def test_adamw_matches_torch(config, layout):
    _run(AdamW, torch.optim.AdamW, ADAMW_CONFIGS[config], layout)


@pytest.mark.parametrize("layout", ["untiled", "tiled"])
@pytest.mark.parametrize("config", ["default", "amsgrad_maximize_wd"])
def test_capturable_adamw_matches_torch_and_the_host_scalars(config, layout):
    """capturable=True keeps the step count on nntile and the kernel works the bias
    corrections out from it, in double as the host does: the same parameters bit for bit
    as capturable=False, and torch.optim's within RTOL."""
    init = _init()
    ours, host, theirs = _params(init, layout), _params(init, layout), _params(init, "cpu")
    kw = ADAMW_CONFIGS[config]
    mine, plain, ref = AdamW(ours, capturable=True, **kw), AdamW(host, **kw), torch.optim.AdamW(theirs, **kw)
    for step in range(STEPS):
        grads = _grads(step, init)
        for ps in (ours, host, theirs):
            _set_grads(ps, grads)
        for opt in (mine, plain, ref):
            opt.step()
    for p, h, q in zip(ours, host, theirs):
        assert torch.equal(p.detach().cpu(), h.detach().cpu())
        assert_close(p.detach().cpu(), q.detach())
    step = mine.state[ours[0]]["step"]
    assert step.device.type == "nntile" and step.item() == STEPS


def test_tiled_update_needs_no_retiling():
    """Gradients and state from other ops take the parameter's tiling through the update's
    merged axis groups: nothing is re-tiled, and a step is one task per tile per parameter."""
    init = _init()
    ps = _params(init, "tiled")
    opt = AdamW(ps, lr=0.01, amsgrad=True)
    for step in range(2):
        _set_grads(ps, _grads(step, init))
        opt.step()
    torch_nntile.execute()
    torch_nntile.wait()
    torch_nntile.reset_info()
    _set_grads(ps, _grads(2, init))
    opt.step()
    for p in ps:
        p.detach().cpu()
    m = torch_nntile.metrics()
    assert not m["retiles"], m["retiles"]
    assert m["kernels"]["adamw_step"]["tasks"] == 2 * 2 + 3 + 1 + 1  # 2x2 + 3 + 1 + 1 tiles


def test_complex_parameter_on_cpu_matches_torch():
    """Complex parameters update as torch.optim does (real and imaginary parts apart)."""
    init = torch.randn(4, 3, dtype=torch.complex64)
    for cls, ref_cls, kw in ((AdamW, torch.optim.AdamW, dict(lr=0.01, amsgrad=True)),
                             (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9))):
        p, q = nn.Parameter(init.clone()), nn.Parameter(init.clone())
        mine, ref = cls([p], **kw), ref_cls([q], **kw)
        for step in range(3):
            p.grad = q.grad = torch.randn(4, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(step))
            mine.step()
            ref.step()
        assert_close(p.detach(), q.detach())


@pytest.mark.parametrize("layout", ["cpu", "tiled"])
def test_param_groups_with_different_options(layout):
    init = _init()
    for cls, ref_cls, extra in ((SGD, torch.optim.SGD, dict(momentum=0.9)),
                                (AdamW, torch.optim.AdamW, dict(betas=(0.5, 0.9)))):
        ours, theirs = _params(init, layout), _params(init, "cpu")

        def groups(ps):
            return [dict(params=ps[:2], lr=0.1, **extra), dict(params=ps[2:], lr=0.01)]

        mine, ref = cls(groups(ours), lr=0.05), ref_cls(groups(theirs), lr=0.05)
        _step_both(mine, ours, ref, theirs, init, range(4))
        _assert_match(mine, ours, ref, theirs, cls.__name__)


def test_param_without_grad_is_skipped():
    init = _init()
    ps = _params(init, "untiled")
    opt = AdamW(ps, lr=0.1)
    grads = _grads(0, init)
    for p, g in zip(ps[1:], grads[1:]):
        p.grad = g.to("nntile")
    opt.step()
    assert torch.equal(ps[0].detach().cpu(), init[0])
    assert ps[0] not in opt.state and ps[1] in opt.state
    assert rel_err(ps[1].detach().cpu(), init[1]) > 1e-3
    sgd = SGD(ps, lr=0.1, momentum=0.9)
    sgd.step()
    assert torch.equal(ps[0].detach().cpu(), init[0]) and ps[0] not in sgd.state


def test_sparse_gradients():
    """AdamW raises as torch.optim.AdamW; SGD takes torch.optim.SGD's sparse path."""
    def embedding_grad(emb):
        emb(torch.tensor([[0, 2], [2, 5]])).sum().backward()

    torch.manual_seed(0)
    ref = nn.Embedding(6, 3, sparse=True)
    mine = copy.deepcopy(ref)
    embedding_grad(mine)
    with pytest.raises(RuntimeError, match="Adam does not support sparse gradients"):
        AdamW(mine.parameters()).step()
    opt, ref_opt = SGD(mine.parameters(), lr=0.1, momentum=0.9), torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    embedding_grad(ref)
    for _ in range(3):
        opt.step()
        ref_opt.step()
    assert_close(mine.weight.detach(), ref.weight.detach())
    assert_close(opt.state[mine.weight]["momentum_buffer"].to_dense(),
                 ref_opt.state[ref.weight]["momentum_buffer"].to_dense())


@pytest.mark.parametrize("which", ["adamw_amsgrad", "sgd_momentum"])
def test_state_dict_round_trip_with_torch(which):
    """Ours (nntile) -> torch.optim (CPU) and torch.optim -> ours, then both go on stepping alike."""
    cls, ref_cls, kw = ((AdamW, torch.optim.AdamW, dict(lr=0.01, amsgrad=True, weight_decay=0.1))
                        if which == "adamw_amsgrad" else (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9)))
    init = _init()
    # ours -> torch
    ours = _params(init, "tiled")
    mine = cls(ours, **kw)
    for step in range(3):
        _set_grads(ours, _grads(step, init))
        mine.step()
    theirs = [nn.Parameter(p.detach().cpu()) for p in ours]
    ref = ref_cls(theirs, **kw)
    ref.load_state_dict(copy.deepcopy(mine.state_dict()))
    assert ref.state_dict()["param_groups"][0]["lr"] == kw["lr"]
    _step_both(mine, ours, ref, theirs, init, range(3, 6), "ours -> torch, ")
    # torch -> ours
    theirs = _params(init, "cpu")
    ref = ref_cls(theirs, **kw)
    for step in range(3):
        _set_grads(theirs, _grads(step, init))
        ref.step()
    ours = _params([q.detach() for q in theirs], "untiled")
    mine = cls(ours, **kw)
    mine.load_state_dict(copy.deepcopy(ref.state_dict()))
    _assert_match(mine, ours, ref, theirs, "torch -> ours, loaded")
    _step_both(mine, ours, ref, theirs, init, range(3, 6), "torch -> ours, ")


def test_lr_scheduler():
    init = _init()
    ours, theirs = _params(init, "untiled"), _params(init, "cpu")
    mine, ref = AdamW(ours, lr=0.1), torch.optim.AdamW(theirs, lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(mine, step_size=2, gamma=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref, step_size=2, gamma=0.5)
    for step in range(6):
        grads = _grads(step, init)
        _set_grads(ours, grads)
        _set_grads(theirs, grads)
        mine.step()
        ref.step()
        sched.step()
        ref_sched.step()
    assert mine.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)
    _assert_match(mine, ours, ref, theirs, "StepLR")


@pytest.mark.parametrize("cls, kw, name", [(SGD, dict(lr=0.1), "sgd_step"),
                                           (SGD, dict(lr=0.1, momentum=0.9, nesterov=True), "sgd_step"),
                                           (AdamW, dict(lr=0.1, amsgrad=True), "adamw_step")])
def test_one_step_records_one_op_per_parameter(cls, kw, name):
    init = _init()
    ps = _params(init, "tiled")
    opt = cls(ps, **kw)
    for step in range(3):
        _set_grads(ps, _grads(step, init))
        torch_nntile.execute()  # only the step is pending below
        pending = torch_nntile.pending_op_names()
        assert pending == [], pending
        opt.step()
        pending = torch_nntile.pending_op_names()
        assert pending.count(name) == len(ps)
        if step:  # the first step also makes the state (zero fills)
            assert pending == [name] * len(ps)
    torch_nntile.wait()


@pytest.mark.parametrize("make", [
    lambda o: o.SGD([nn.Parameter(torch.ones(2))], lr=-0.1),
    lambda o: o.SGD([nn.Parameter(torch.ones(2))], lr=torch.tensor([0.1, 0.2])),
    lambda o: o.SGD([nn.Parameter(torch.ones(2))], momentum=-0.5),
    lambda o: o.SGD([nn.Parameter(torch.ones(2))], weight_decay=-1.0),
    lambda o: o.SGD([nn.Parameter(torch.ones(2))], nesterov=True),
    lambda o: o.SGD([nn.Parameter(torch.ones(2))], momentum=0.9, dampening=0.1, nesterov=True),
    lambda o: o.SGD([], lr=0.1),
    lambda o: o.AdamW([nn.Parameter(torch.ones(2))], lr=-1e-3),
    lambda o: o.AdamW([nn.Parameter(torch.ones(2))], eps=-1.0),
    lambda o: o.AdamW([nn.Parameter(torch.ones(2))], betas=(1.0, 0.999)),
    lambda o: o.AdamW([nn.Parameter(torch.ones(2))], betas=(0.9, -0.1)),
    lambda o: o.AdamW([nn.Parameter(torch.ones(2))], weight_decay=-0.1),
    lambda o: o.AdamW([nn.Parameter(torch.ones(2))], betas=(0.9, torch.tensor(0.99))),
    lambda o: o.AdamW([nn.Parameter(torch.ones(2))], betas=(torch.tensor([0.9, 0.8]), torch.tensor(0.99))),
], ids=["sgd_lr", "sgd_lr_tensor", "sgd_momentum", "sgd_wd", "sgd_nesterov_no_momentum", "sgd_nesterov_dampening",
        "sgd_empty", "adamw_lr", "adamw_eps", "adamw_beta0", "adamw_beta1", "adamw_wd", "adamw_betas_mixed",
        "adamw_beta_tensor_size"])
def test_invalid_arguments_raise_as_torch(make):
    """torch.optim's ValueErrors (and the RuntimeError of comparing a 2-element beta)."""
    with pytest.raises((ValueError, RuntimeError)) as want:
        make(torch.optim)
    with pytest.raises((ValueError, RuntimeError)) as got:
        make(training)
    assert type(got.value) is type(want.value) and str(got.value) == str(want.value)


def test_train_full_batch_step_with_our_optimizers():
    """Through training.train_full_batch_step on a small nn.Sequential (batch tiled unevenly),
    against torch.optim on CPU."""
    torch.manual_seed(3)
    ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(24, 8, generator=g), torch.randint(0, 4, (24,), generator=g)
    for cls, ref_cls, kw in ((AdamW, torch.optim.AdamW, dict(lr=0.01)),
                             (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9))):
        cpu_model = copy.deepcopy(ref)
        model = copy.deepcopy(ref).to("nntile")
        opt, ref_opt = cls(model.parameters(), **kw), ref_cls(cpu_model.parameters(), **kw)
        xn, yn = x.to("nntile"), y.to("nntile")
        for _ in range(4):
            loss = training.train_full_batch_step(model, xn, yn, opt, name_axes={0: "batch"},
                                                  tilings={"batch": [10, 14]})
            want = training.train_full_batch_step(cpu_model, x, y, ref_opt)
            assert abs(loss - want) <= RTOL * abs(want)
        for p, q in zip(model.parameters(), cpu_model.parameters()):
            assert_close(p.detach().cpu(), q.detach())
        assert rel_err(cpu_model[0].weight.detach(), ref[0].weight.detach()) > 1e-3


def test_operands_nntile_lacks_run_on_the_fallback():
    """A case the recording form declines (a gradient of another dtype, only reachable by
    calling the op itself) raises naming the op, or runs on the CPU fallback when enabled."""
    p, g = torch.ones(3, dtype=torch.float64), torch.full((3,), 2.0)
    args = (None, 0.1, 0.0, 0.0, 0.0, False, False, False)
    with pytest.raises(NotImplementedError, match=r"torch_nntile::sgd_step is not supported .*dtype torch.float32"):
        torch.ops.torch_nntile.sgd_step(p.to("nntile"), g.to("nntile"), *args)
    torch_nntile.init_context(ncpu=2, cpu_fallback=True)
    torch_nntile.reset_info()
    pn = p.to("nntile")
    torch.ops.torch_nntile.sgd_step(pn, g.to("nntile"), *args)
    torch.ops.torch_nntile.sgd_step(p, g, *args)
    assert_close(pn.cpu(), p)
    assert p[0].item() == pytest.approx(0.8)
    assert torch_nntile.fallback_counts().get("torch_nntile::sgd_step") == 1
