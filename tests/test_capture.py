"""torch_nntile.capture: a replayed step gives the numbers of a recorded one, and what a
replay cannot repeat is refused with CaptureError (nothing changed by a refused replay)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close, run_python

import torch_nntile
from torch_nntile import CaptureError, training


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.GELU(), torch.nn.Linear(9, 4))


def batches(n: int, rows: int = 5) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(rows, 6, generator=g) for _ in range(n)]


def trainer(device: str, capturable: bool, tiles: list[int] | None = None, adamw: type = torch.optim.AdamW):
    """A model, its AdamW and a step function returning the loss (tensor)."""
    model = mlp().to(device)
    opt = adamw(model.parameters(), lr=1e-2, capturable=capturable)

    def step(x: torch.Tensor) -> torch.Tensor:
        if tiles is not None:
            torch_nntile.set_axis_group_name(x, {0: "cap_rows"})
            torch_nntile.set_axis_group_tiling("cap_rows", tiles)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return model, step


def refused_at_the_third_call(fn, args: list[tuple], match: str) -> None:
    """Calls 1 and 2 of ``capture(fn)`` run (the second traced); the third, traced and
    compared with the second, raises ``match``."""
    step = torch_nntile.capture(fn)
    step(*args[0])
    step(*args[1])
    with pytest.raises(CaptureError, match=match):
        step(*args[2])


@pytest.mark.parametrize("adamw", [torch.optim.AdamW, training.AdamW], ids=["torch", "fused"])
@pytest.mark.parametrize("tiles", [None, [3, 2]], ids=["untiled", "uneven"])
def test_replay_gives_the_recorded_numbers(tiles, adamw):
    plain_model, plain = trainer("nntile", True, tiles, adamw)
    cap_model, fn = trainer("nntile", True, tiles, adamw)
    step = torch_nntile.capture(fn)
    for x in batches(7):
        xn = x.to("nntile")
        want = plain(xn).detach().cpu()  # each side's step in compiles of its own: a compile holding both
        got = step(xn).cpu()  # would lower the first side's reductions otherwise (split_chains looks ahead)
        assert torch.equal(got, want)
    assert step.replays == 4
    for a, b in zip(plain_model.parameters(), cap_model.parameters()):
        assert torch.equal(a.detach().cpu(), b.detach().cpu())
    assert torch_nntile.info()["phases"]["replay"]["calls"] >= 4


def test_replay_matches_cpu_training():
    cpu_model, cpu_step = trainer("cpu", False)
    dev_model, fn = trainer("nntile", True)
    step = torch_nntile.capture(fn)
    for x in batches(6):
        assert_close(step(x.to("nntile")).cpu(), cpu_step(x).detach())
    for a, b in zip(dev_model.parameters(), cpu_model.parameters()):
        assert_close(a.detach().cpu(), b.detach())


def test_results_are_new_tensors():
    _, fn = trainer("nntile", True)
    step = torch_nntile.capture(fn)
    xs = [x.to("nntile") for x in batches(6)]
    outs = [step(x) for x in xs]
    values = [o.item() for o in outs]
    assert not outs[-1].requires_grad and outs[-1].device.type == "nntile"
    assert len(set(values)) == len(values)  # each replay's loss is its own value, not the last one's


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_hf_gpt2_replays_its_mask_checks(attn):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=8, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation=attn)

    def build():
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(cfg).to("nntile")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)

        def fn(ids):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        return model, fn

    (m1, plain), (m2, fn) = build(), build()
    step = torch_nntile.capture(fn)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        ids = torch.randint(0, 40, (2, 8), generator=g).to("nntile")
        assert torch.equal(step(ids).cpu(), plain(ids).detach().cpu())
    assert step.replays == 2
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a.detach().cpu(), b.detach().cpu())


def test_changing_python_scalars_are_refused():
    model, fn = trainer("nntile", False)  # torch.optim's bias corrections: Python floats that change every step
    refused_at_the_third_call(fn, [(x.to("nntile"),) for x in batches(3)], "other kernel parameters.*capturable=True")
    cpu_model, cpu_step = trainer("cpu", False)
    for x in batches(3):
        cpu_step(x)
    for a, b in zip(model.parameters(), cpu_model.parameters()):  # the refused call ran: its results are in place
        assert_close(a.detach().cpu(), b.detach())


def test_cpu_arguments_are_refused():
    _, fn = trainer("nntile", True)
    with pytest.raises(CaptureError, match="argument 0 is a tensor on cpu"):
        torch_nntile.capture(fn)(torch.randn(5, 6))


def test_a_changed_argument_shape_is_refused_and_changes_nothing():
    model, fn = trainer("nntile", True)
    step = torch_nntile.capture(fn)
    for x in batches(4):
        step(x.to("nntile"))
    before = [p.detach().cpu() for p in model.parameters()]
    with pytest.raises(CaptureError, match=r"argument 0 is \[4, 6\].*captured as \[5, 6\]"):
        step(torch.randn(4, 6).to("nntile"))
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach().cpu(), b)


def test_reading_a_changing_value_is_refused():
    _, fn = trainer("nntile", True)
    refused_at_the_third_call(lambda x: fn(x).item(), [(x.to("nntile"),) for x in batches(3)],
                              "a value read back inside the step differs")


def test_a_branch_on_a_value_is_checked_at_every_replay():
    w = torch.zeros(3).to("nntile")

    def fn(x):
        if (x > 0).any():
            w.add_(x)
        else:
            w.sub_(x)
        return w.sum()

    step = torch_nntile.capture(fn)
    for _ in range(4):
        step(torch.ones(3).to("nntile"))
    assert step.replays == 1
    assert torch.equal(w.cpu(), torch.full((3,), 4.0))
    with pytest.raises(CaptureError, match="not what it was when the step was captured.*nothing was changed"):
        step(-torch.ones(3).to("nntile"))
    assert torch.equal(w.cpu(), torch.full((3,), 4.0))


def test_a_tensor_kept_outside_the_result_is_refused():
    kept = []

    def fn(x):
        y = x * 2
        kept.append(y)
        return y.sum()

    refused_at_the_third_call(fn, [(torch.ones(3).to("nntile"),)] * 3, "kept a tensor it made")


def test_non_tensor_results_and_views():
    base = torch.arange(6.0).to("nntile")

    def fn(x):
        base.mul_(x)
        return {"n": 3, "view": base[1:4], "sum": base.sum()}

    step = torch_nntile.capture(fn)
    want = torch.arange(6.0)
    for _ in range(5):
        out = step(torch.full((6,), 2.0).to("nntile"))
        want = want * 2
        assert out["n"] == 3
        assert torch.equal(out["view"].cpu(), want[1:4])
        assert torch.equal(out["sum"].cpu(), want.sum())
    assert torch.equal(base.cpu(), want)
    assert step.replays == 2


def test_arguments_must_be_passed_alike():
    w = torch.zeros(3).to("nntile")

    def fn(a, b, scale):
        w.add_(a * scale + b)
        return w.sum()

    step = torch_nntile.capture(fn)
    x, y = torch.ones(3).to("nntile"), torch.full((3,), 2.0).to("nntile")
    for _ in range(4):
        step(x, y, 3.0)
    assert step.replays == 1 and torch.equal(w.cpu(), torch.full((3,), 20.0))
    with pytest.raises(CaptureError, match=r"argument 2 is 4.0, captured as 3.0"):
        step(x, y, 4.0)
    with pytest.raises(CaptureError, match="argument 1 shares its storage with argument 0"):
        step(x, x, 3.0)
    assert torch.equal(w.cpu(), torch.full((3,), 20.0))
    step(y, x, 3.0)  # other tensors of the same geometry
    assert torch.equal(w.cpu(), torch.full((3,), 27.0))


def test_random_ops_are_refused():
    w = torch.ones(8).to("nntile")

    def fn(x):
        return torch.nn.functional.dropout(x * w, 0.5).sum()

    refused_at_the_third_call(fn, [(torch.ones(8).to("nntile"),)] * 3, "other kernel parameters or data")


def test_a_replay_after_shutdown_raises():
    code = (
        "import torch, torch_nntile\n"
        "torch_nntile.init_context(ncpu=2)\n"
        "w = torch.zeros(3).to('nntile')\n"
        "def fn(x):\n"
        "    w.add_(x)\n"
        "    return w.sum()\n"
        "step = torch_nntile.capture(fn)\n"
        "for _ in range(4):\n"
        "    step(torch.ones(3).to('nntile'))\n"
        "assert step.replays == 1\n"
        "torch_nntile.shutdown_context()\n"
        "torch_nntile.init_context(ncpu=2)\n"
        "try:\n"
        "    step(torch.ones(3).to('nntile'))\n"
        "except torch_nntile.CaptureError as e:\n"
        "    print('refused:', e)\n"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert "refused: capture: the context the step was captured in was shut down" in out.stdout


def test_results_that_are_values_from_before_the_step():
    w = torch.arange(3.0).to("nntile")
    acc = torch.zeros(3).to("nntile")

    def fn(x):
        acc.add_(x * w)
        return x, w, acc

    step = torch_nntile.capture(fn)
    for i in range(5):
        x = torch.full((3,), float(i)).to("nntile")
        got_x, got_w, got_acc = step(x)
        assert torch.equal(got_x.cpu(), torch.full((3,), float(i)))
        assert torch.equal(got_w.cpu(), torch.arange(3.0))
    assert step.replays == 2
    assert torch.equal(acc.cpu(), torch.arange(3.0) * 10) and torch.equal(got_acc.cpu(), acc.cpu())


def test_an_argument_tiled_otherwise_is_refused():
    w = torch.zeros(5).to("nntile")

    def fn(x):
        w.add_(x)
        return w.sum()

    def arg(tiles):
        x = torch.ones(5).to("nntile")
        torch_nntile.set_axis_group_name(x, {0: "cap_arg"})
        torch_nntile.set_axis_group_tiling("cap_arg", tiles)
        return x

    step = torch_nntile.capture(fn)
    for _ in range(4):
        step(arg([3, 2]))
    assert step.replays == 1
    with pytest.raises(CaptureError, match=r"argument 0\) is now \[5\] torch.float32 tiled \(\(5,\),\), captured as "
                                           r"\[5\] torch.float32 tiled \(\(3, 2\),\)"):
        step(arg(5))
    assert torch.equal(w.cpu(), torch.full((5,), 4.0))
