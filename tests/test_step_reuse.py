"""Reuse of lowered steps (``tiling.reuse``): a compile with the structure of an earlier
one takes its tasks on new tiles. Results are those of lowering every compile (bit for
bit), values that change between steps (Python scalars, CPU scalars, CPU data, which
tensors share tiles, which results the program keeps, tilings) take effect, and the
check mode finds no compile whose tasks differ from its template's."""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch
from conftest import assert_close, run_python

import torch_nntile
from torch_nntile.session import SESSION_STATE


@pytest.fixture
def steps():
    """The session's cache of lowered steps, reuse on and check mode off (restored after)."""
    cache = SESSION_STATE.steps
    enabled, check = cache.enabled, cache.check
    cache.enabled, cache.check = True, False
    yield cache
    cache.enabled, cache.check = enabled, check


def counts() -> tuple[int, int]:
    d = torch_nntile.info()
    return d["compiles_reused"], d["compiles_lowered"]


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 5))


def train(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, n: int, tiles: list[int] | None = None) -> list[float]:
    """``n`` AdamW steps (its bias corrections are new Python floats every step); the losses."""
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    if tiles is not None:
        torch_nntile.set_axis_group_name(x, {0: "reuse_batch"})
        torch_nntile.set_axis_group_tiling("reuse_batch", tiles)
    out = []
    for _ in range(n):
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(loss.item())
    return out


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(9, 12, generator=g), torch.randint(0, 5, (9,), generator=g)


@pytest.mark.parametrize("tiles", [None, [4, 5]], ids=["untiled", "uneven"])
def test_training_reuses_steps_and_matches_cpu(steps, tiles):
    x, y = data()
    cpu = model()
    dev = copy.deepcopy(cpu).to("nntile")
    want = train(cpu, x, y, 6)
    torch_nntile.reset_info()
    got = train(dev, x.to("nntile"), y.to("nntile"), 6, tiles)
    reused, lowered = counts()
    assert reused >= 3, (reused, lowered)  # from the fourth step on (the first makes the optimizer's state)
    assert got == pytest.approx(want, rel=1e-5)
    for p, q in zip(dev.parameters(), cpu.parameters()):
        assert_close(p.detach().cpu(), q.detach(), rtol=1e-5)


def test_updates_writing_held_averages_are_reused(steps):
    """Foreach AdamW's update is one fused op per group writing the parameters and both
    running averages (held results kept as further outputs): reused from the fourth
    step on, as any compile (the first makes the state, the third the template)."""
    cpu = model(3)
    dev = copy.deepcopy(cpu).to("nntile")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (cpu, dev)]
    g = torch.Generator().manual_seed(9)
    for i in range(6):
        for p, q in zip(cpu.parameters(), dev.parameters()):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.to("nntile")
        torch_nntile.execute()  # the gradients' copies: compiles of their own
        torch_nntile.wait()
        if i == 3:
            torch_nntile.reset_info()
        for opt in opts:
            opt.step()
        torch_nntile.execute()
    reused, lowered = counts()
    assert reused == 5 and lowered == 0, (reused, lowered)  # three updates, the later two steps' copies
    for p, q in zip(dev.parameters(), cpu.parameters()):
        assert_close(p.detach().cpu(), q.detach(), rtol=1e-5)
        for key in ("exp_avg", "exp_avg_sq"):
            assert_close(opts[1].state[p][key].cpu(), opts[0].state[q][key], rtol=1e-5)


@pytest.mark.parametrize("tiles", [None, [4, 5]], ids=["untiled", "uneven"])
def test_reused_steps_give_the_numbers_of_lowered_ones(steps, tiles):
    x, y = data()
    runs = []
    for enabled in (True, False):
        steps.enabled = enabled
        m = model().to("nntile")
        torch_nntile.reset_info()
        losses = train(m, x.to("nntile"), y.to("nntile"), 5, tiles)
        torch_nntile.wait()
        runs.append((losses, [p.detach().cpu() for p in m.parameters()], counts()))
    (l1, p1, c1), (l2, p2, c2) = runs
    assert c1[0] > 0 and c2[0] == 0, (c1, c2)
    assert l1 == l2
    for a, b in zip(p1, p2):
        assert torch.equal(a, b)


def test_scalars_and_cpu_data_that_change_take_effect(steps):
    torch.manual_seed(7)
    x = torch.randn(4, 6)
    xd = x.to("nntile")
    torch_nntile.reset_info()
    for i in range(6):
        s, c = 0.5 * i - 1.0, torch.tensor(float(i) ** 2)  # a Python float and a CPU scalar tensor
        noise = torch.randn(4, 6)  # new CPU data each step
        want = torch.tanh(x * s + c) - noise * (i + 1)
        got = torch.tanh(xd * s + c) - noise.to("nntile") * (i + 1)
        assert_close(got.cpu(), want)
    assert counts()[0] >= 3


def test_signed_zero_scalars_of_other_ops_are_told_apart(steps):
    for value in (0.0, 0.0, 0.0, -0.0, -0.0, 0.0):
        got = torch.full((3,), value, device="nntile").cpu()
        assert torch.equal(torch.signbit(got), torch.signbit(torch.full((3,), value)))


def test_inputs_sharing_tiles_is_part_of_the_structure(steps):
    torch.manual_seed(8)
    a = torch.randn(4, 6)
    ad = a.to("nntile")
    alias = ad.view(6, 4)  # shares ad's tiles once lowered
    other = (torch.randn(6, 4) * 3).to("nntile")
    torch_nntile.execute()
    torch_nntile.wait()
    for b in (alias, alias, alias, other, other, alias, other):
        got = (ad.reshape(6, 4) + 2 * b).sum(0)
        want = (a.reshape(6, 4) + 2 * b.cpu()).sum(0)
        assert_close(got.cpu(), want)


def test_results_the_program_keeps_change_the_structure(steps):
    torch.manual_seed(9)
    x = torch.randn(5, 7)
    xd = x.to("nntile")
    for i in range(8):
        h = torch.tanh(xd * 2)  # fused into the sum's chain unless the program keeps it
        y = (h + 1).sum()
        if i % 3 == 2:
            assert_close(h.cpu(), torch.tanh(x * 2))
        assert_close(y.cpu(), (torch.tanh(x * 2) + 1).sum())
        del h


def test_tilings_that_change_between_steps(steps):
    torch.manual_seed(10)
    x, w = torch.randn(9, 8), torch.randn(8, 8)
    xd, wd = x.to("nntile"), w.to("nntile")
    torch_nntile.set_axis_group_name(xd, {0: "reuse_rows"})
    for tiles in ([4, 5], [4, 5], [4, 5], None, None, [3, 3, 3], [4, 5], None):
        torch_nntile.set_axis_group_tiling("reuse_rows", tiles)
        got = torch.relu(xd @ wd) * 2
        assert_close(got.cpu(), torch.relu(x @ w) * 2)


def test_check_mode_finds_the_templates_of_a_training_loop(steps):
    steps.check = True
    x, y = data()
    cpu = model()
    dev = copy.deepcopy(cpu).to("nntile")
    want = train(cpu, x, y, 5)
    torch_nntile.reset_info()
    got = train(dev, x.to("nntile"), y.to("nntile"), 5, [4, 5])
    assert torch_nntile.info()["compiles_checked"] >= 4
    assert got == pytest.approx(want, rel=1e-5)


def test_check_mode_on_a_gpt2_training_step(steps):
    hf = pytest.importorskip("transformers")
    steps.check = True
    cfg = hf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=16, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
    torch.manual_seed(11)
    cpu = hf.GPT2LMHeadModel(cfg)
    dev = copy.deepcopy(cpu).to("nntile")
    ids = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(12))
    idd = ids.to("nntile")
    torch_nntile.set_axis_group_name(idd, {0: "reuse_gpt_batch"})
    torch_nntile.set_axis_group_tiling("reuse_gpt_batch", [1, 3])
    torch_nntile.reset_info()
    for m, i in ((cpu, ids), (dev, idd)):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        for _ in range(5):
            loss = m(input_ids=i, labels=i).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            m.last = loss.item()  # a read-back a step: the compiles of every step alike
    assert torch_nntile.info()["compiles_checked"] >= 2
    assert dev.last == pytest.approx(cpu.last, rel=1e-4)


def test_info_reports_the_reuse(steps):
    x, y = data()
    torch_nntile.reset_info()
    train(model().to("nntile"), x.to("nntile"), y.to("nntile"), 4)
    reused, lowered = counts()
    assert reused > 0
    assert f"compiles that reused a lowered step: {reused} of {reused + lowered}" in torch_nntile.format_info()


def test_reuse_can_be_switched_off():
    r = run_python("""
        import torch, torch_nntile
        torch_nntile.init_context(ncpu=2)
        x = torch.randn(5, 5).to("nntile")
        for _ in range(4):
            (x * 2).cpu()
        print(torch_nntile.info()["compiles_reused"])
    """, env={**os.environ, "TORCH_NNTILE_REUSE": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0"]


def test_reused_steps_rebind_new_scalars_instead_of_preparing(steps, monkeypatch):
    """A reused compile whose kernels equal its template's last ones is sent to StarPU
    as the batch prepared then (on its own tiles). One whose scalars changed gets them
    written into that batch (``Runtime.rebind``), which then equals a batch prepared
    anew; one whose new scalar makes another C program (``x ** 2`` is ``x * x``) is
    prepared anew. Values are CPU's throughout."""
    rt = SESSION_STATE.rt
    prepared, rebound = [], []
    real_prepare, real_rebind = rt.prepare, rt.rebind
    monkeypatch.setattr(rt, "prepare", lambda tasks, *a: prepared.append(len(tasks)) or real_prepare(tasks, *a))

    def rebind(b, tasks, changed):
        ok = real_rebind(b, tasks, changed)
        if ok:
            fresh = real_prepare(tasks)
            assert (list(b.ew), list(b.ewc), b.closures) == (list(fresh.ew), list(fresh.ewc), fresh.closures)
            rebound.append(len(tasks))
        return ok

    monkeypatch.setattr(rt, "rebind", rebind)
    torch.manual_seed(13)
    x = torch.randn(6, 5)
    xd = x.to("nntile")
    torch_nntile.set_axis_group_name(xd, {0: "rebind_rows"})
    torch_nntile.set_axis_group_tiling("rebind_rows", [4, 2])
    per_step = []
    for e in [2.5] * 6 + [3.5, 4.5, 2, 2]:
        got = torch.sigmoid(xd @ xd.T) ** e
        assert_close(got.cpu(), torch.sigmoid(x @ x.T) ** e)
        per_step.append((sum(1 for n in prepared if n > 1), len(rebound)))  # the readout's task is prepared apart
        prepared.clear()
        rebound.clear()
    assert per_step[4:6] == [(0, 0), (0, 0)], per_step  # bound again with equal kernels: the last batch
    assert per_step[6:8] == [(0, 1), (0, 1)], per_step  # new exponents: rebound
    assert per_step[8:] == [(1, 0), (0, 0)], per_step  # another program: prepared, then bound again


def test_rebound_python_tasks_run_their_new_scalars(steps, monkeypatch):
    """Tasks that run as Python (float64 arithmetic here: the C programs are float32) are
    rebound to the new kernel too: each step computes with its own scalar."""
    rt = SESSION_STATE.rt
    rebound = []
    real_rebind = rt.rebind

    def rebind(b, tasks, changed):
        changed = list(changed)
        ok = real_rebind(b, tasks, changed)
        if ok:
            rebound.append(sum(1 for j in changed if j in b.py_at))
        return ok

    monkeypatch.setattr(rt, "rebind", rebind)
    xi = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    xd = xi.to("nntile")
    for k in [3, 3, 3, 3, 4, 7]:
        assert torch.equal(((xd + 1) * k).cpu(), (xi + 1) * k)
    assert rebound[-2:] and all(rebound[-2:]), rebound  # the last two steps: Python tasks rebound


def test_zero_size_and_0_dim_values_in_reused_steps(steps):
    torch.manual_seed(14)
    empty, scalar = torch.randn(0, 4), torch.randn(())
    ed, sd = empty.to("nntile"), scalar.to("nntile")
    torch_nntile.reset_info()
    for i in range(6):
        got_empty = (ed * (i + 1)).sum(0) + sd  # [4] from a zero-size value, plus a 0-dim one
        got_scalar = torch.tanh(sd * (i - 2.5))
        assert_close(got_empty.cpu(), (empty * (i + 1)).sum(0) + scalar)
        assert_close(got_scalar.cpu(), torch.tanh(scalar * (i - 2.5)))
    assert counts()[0] >= 3


def test_ops_sharing_a_kernel_are_bound_apart_once_they_stop_sharing(steps):
    """Two ops holding one kernel object are one hole of the template; a later compile
    of that structure whose two ops hold different kernels is not bound through it
    (each op computes with its own scalar)."""
    from torch_nntile.backend.aten import out_kernel
    from torch_nntile.backend.device import new_tensor
    from torch_nntile.ops.base import map_op

    torch.manual_seed(15)
    x = torch.randn(5)
    xd = x.to("nntile")
    torch_nntile.execute()
    torch_nntile.wait()
    torch_nntile.reset_info()
    for a, b in [(2.0, 2.0)] * 3 + [(2.0, 3.0), (2.0, 2.0), (2.0, 3.0), (2.0, 3.0)]:
        ka, nodes = out_kernel(torch.mul, [xd, a])
        kb = ka if a == b else out_kernel(torch.mul, [xd, b])[0]
        ya = new_tensor(map_op("mul", ka, nodes, torch.float32))
        yb = new_tensor(map_op("mul", kb, nodes, torch.float32))
        assert_close(ya.cpu(), x * a)
        assert_close(yb.cpu(), x * b)
    assert counts()[0] >= 3


class _Def:
    def __init__(self, binds_kernel: bool = False, binds_data: bool = False) -> None:
        self.binds_kernel, self.binds_data = binds_kernel, binds_data


class _Group:
    def __init__(self, parent: _Group | None = None) -> None:
        self.parent = parent


class _Node:
    def __init__(self, shape: tuple[int, ...], axes: tuple[_Group, ...], value: object = None) -> None:
        self.shape, self.dtype, self.axes, self.value = shape, torch.float32, axes, value


class _Tiles:
    def __init__(self, handles: list[object], tiling: tuple) -> None:
        self.handles, self.tiling = handles, tiling


class _Op:
    def __init__(self, opdef: _Def, inputs: tuple[_Node, ...], attrs: object, outputs: tuple[_Node, ...]) -> None:
        self.opdef, self.inputs, self.attrs, self.outputs = opdef, inputs, attrs, outputs


def test_structure_key_parts_in_c():
    """The key's C loop (``tiling/csrc/structure.c``) on stand-in ops: values numbered in
    order (those from before the compile negative, with their tiles' slots), an output
    flagged when this compile's readers are all that hold it, tilings looked up by root
    group or planned, and attribute keys that tell apart what lowering could treat
    differently (``1``, ``True``, ``1.0``, ``-0.0``)."""
    from torch_nntile.tiling import _structure
    from torch_nntile.tiling.reuse import Uncacheable, _attr_key, _op_attrs

    root, other = _Group(), _Group()
    child = _Group(_Group(root))  # two links from its root
    plain, kernel = _Def(), _Def(binds_kernel=True)
    h1, h2 = object(), object()  # tile handles
    ext_tiles = _Tiles([h1, h2, h1], ((1, 2, 1),))
    ext = _Node((4,), (root,), ext_tiles)  # a value from before the compile, its first and last tile shared

    def compile_ops() -> tuple[list[_Op], _Node]:
        """Three ops; only the ops hold their outputs but for the last, which is returned."""
        a = _Node((4,), (child,))
        b = _Node((3, 4), (other, root))
        kept = _Node((4,), (root,))
        return [_Op(plain, (ext,), (1, (True, 2), None, "s"), (a,)),
                _Op(kernel, (a, ext), ("a kernel", "add"), (b,)),
                _Op(plain, (b,), (1.0, -0.0), (kept,))], kept

    ops, kept = compile_ops()
    planned: list[_Node] = []

    def plan(n: _Node) -> tuple:
        planned.append(n)
        return ("planned", n.shape)

    def key(parts: list, ops: list[_Op] = ops, known: dict | None = None) -> tuple[list, list, dict]:
        nodes, values, slot_of = [], [], {}
        known = {root: (2, 2), other: (3,)} if known is None else known
        assert _structure.parts(ops, parts, _op_attrs, _attr_key, plan, known,
                                (nodes, values, slot_of, Uncacheable)) is None
        return nodes, values, slot_of

    parts: list = []
    nodes, values, slot_of = key(parts)
    assert nodes == [ext] and values == [ext_tiles] and slot_of == {h1: 0, h2: 1}
    assert planned == []
    f32 = torch.float32
    assert parts == [  # numbers: ext -1, then the outputs 1, 2, 3 (values are numbered in one sequence)
        ((4,), f32, ((2, 2),), ((1, 2, 1),), (0, 1, 0)),  # ext: shape, dtype, planned tiling, its tiling, slots
        (plain, (1, ((bool, True), 2), None, "s"), (-1,), (((4,), f32, ((2, 2),), True),)),
        (kernel, "add", (1, -1), (((3, 4), f32, ((3,), (2, 2)), True),)),
        (plain, ((float, (1.0).hex()), (float, (-0.0).hex())), (2,), (((4,), f32, ((2, 2),), False),)),
    ]
    # nothing leaks: the values, attributes and tilings hold as many references as before
    del nodes, values, slot_of
    watched = [ext, ext_tiles, h1, kept, kept.shape, ops[0].attrs, ops[0].attrs[1], ops[1].outputs[0], root, other,
               plain, kernel]
    before = [sys.getrefcount(x) for x in watched]
    for _ in range(100):
        key([])
    assert [sys.getrefcount(x) for x in watched] == before

    # an unknown root group is planned in Python; an error there, in a key or a value
    # from before with no tiles yet propagates
    parts = []
    key(parts, [_Op(plain, (), 0, (_Node((2,), (_Group(),)),))], {})
    assert len(planned) == 1 and parts[0][3][0][2] == ("planned", (2,))
    with pytest.raises(Uncacheable):
        key([], [_Op(plain, (), object(), ())])
    with pytest.raises(Uncacheable, match="unlowered input"):
        key([], [_Op(plain, (_Node((4,), (root,)),), 0, ())])
