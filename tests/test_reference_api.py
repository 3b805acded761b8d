"""The published torch_nntile's context API, as this package gives it: the context
queries, ``reset_graph_session``, ``init_context``'s ``runtime_mode`` / ``verbose`` /
``ncpu=-1`` and ``ddp``."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, run_python

import torch_nntile


def test_context_queries_in_a_fresh_process():
    code = """
        import torch, torch_nntile
        print(torch_nntile.is_context_initialized(), torch_nntile.has_pending_graph())
        x = torch.ones(3).to("nntile")        # the first op starts a context
        y = x * 2
        print(torch_nntile.is_context_initialized(), torch_nntile.has_pending_graph())
        print(y.cpu().tolist(), torch_nntile.has_pending_graph())
        torch_nntile.shutdown_context()
        print(torch_nntile.is_context_initialized())
    """
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["False False", "True True", "[2.0, 2.0, 2.0] False", "False"]


def test_cpu_fallback_query_follows_init_context():
    assert torch_nntile.is_cpu_fallback_enabled() is False
    torch_nntile.init_context(ncpu=2, cpu_fallback=True)
    assert torch_nntile.is_cpu_fallback_enabled() is True
    torch_nntile.init_context(ncpu=2, cpu_fallback=False)
    assert torch_nntile.is_cpu_fallback_enabled() is False


def test_reset_graph_session_keeps_values_and_forgets_tilings():
    x = torch.randn(12, 5)
    a = x.to("nntile")
    torch_nntile.set_axis_group_name(a, {0: "rows_reset"})
    torch_nntile.set_axis_group_tiling("rows_reset", [7, 5])
    y = torch.tanh(a) * 3
    assert torch_nntile.has_pending_graph()
    torch_nntile.reset_graph_session()
    assert not torch_nntile.has_pending_graph()
    assert "tiles=7,5" not in torch_nntile.format_axis_groups()
    assert_close(y.cpu(), torch.tanh(x) * 3)
    z = y + a  # recorded afresh, untiled now
    assert_close(z.cpu(), torch.tanh(x) * 3 + x)


def test_eager_mode_runs_each_op_and_raises_at_it():
    torch_nntile.init_context(ncpu=2, runtime_mode="eager")
    try:
        x = torch.randn(4, 3)
        a = x.to("nntile")
        b = a.exp() + 1
        assert not torch_nntile.has_pending_graph()  # run and waited for already
        assert_close(b.cpu(), x.exp() + 1)
        target = torch.tensor([0, 1, 7, 2]).to("nntile")  # 7: out of range for 3 classes
        with pytest.raises(torch_nntile.KernelError, match="nll_loss"):
            F.nll_loss(a, target)  # raised by the op itself, not by a later read-back
    finally:
        torch_nntile.init_context(ncpu=2, runtime_mode="graph")
    c = torch.ones(2).to("nntile") * 5
    assert torch_nntile.has_pending_graph()
    assert c.cpu().tolist() == [5.0, 5.0]


def test_init_context_arguments_checked_and_reinit_names_init_context():
    with pytest.raises(ValueError, match="runtime_mode must be 'graph' or 'eager', got 'lazy'"):
        torch_nntile.init_context(ncpu=2, runtime_mode="lazy")
    with pytest.raises(RuntimeError, match=r"^init_context: the torch_nntile context is already initialized with ncpu=2"):
        torch_nntile.init_context(ncpu=3)


def test_ncpu_minus_one_and_verbose():
    out = run_python("import torch_nntile\ntorch_nntile.init_context(ncpu=-1, verbose=1)\n")
    assert out.returncode == 0, out.stderr
    n = len(os.sched_getaffinity(0))
    assert out.stdout.startswith(f"torch_nntile: StarPU started with {n} CPU and 0 CUDA worker(s), scheduler lws"), out.stdout
    assert "graph mode, CPU fallback off" in out.stdout


@pytest.mark.parametrize("extent, want", [(10, "ntiles=2 pending_tiles=5,5"), (7, "ntiles=2 pending_tiles=4,3"),
                                          (1, "ntiles=1 pending_tiles=1")])
def test_ddp_splits_the_group_per_worker(extent, want):
    x = torch.randn(extent, 6)
    w = torch.randn(6, 4)
    a, b = x.to("nntile"), w.to("nntile")
    name = f"batch_ddp_{extent}"
    torch_nntile.set_axis_group_name(a, {0: name})
    torch_nntile.ddp(axis=name)  # 2 CPU workers in the tests
    row = next(r for r in torch_nntile.format_axis_groups().splitlines() if r.split()[0] == f"name='{name}'")
    assert row.endswith(" pending_" + want), row
    assert_close((torch.relu(a @ b)).cpu(), torch.relu(x @ w))


def test_ddp_before_the_group_exists_and_a_second_axis():
    torch_nntile.ddp("batch_later")  # as the reference's scripts: before any tensor has the name
    torch_nntile.ddp("batch_later")  # the same axis again changes nothing
    with pytest.raises(RuntimeError, match="already enabled over axis 'batch_later'"):
        torch_nntile.ddp("hidden")
    x, w = torch.randn(5, 6), torch.randn(6, 4)
    a = x.to("nntile")
    torch_nntile.set_axis_group_name(a, {0: "batch_later"})
    row = next(r for r in torch_nntile.format_axis_groups().splitlines() if r.split()[0] == "name='batch_later'")
    assert row.endswith(" pending_ntiles=2 pending_tiles=3,2"), row
    assert_close((a @ w.to("nntile")).cpu(), x @ w)
    torch_nntile.set_axis_group_tiling("batch_later", 5)  # a tiling replaces the split
    torch_nntile.ddp("hidden")


def test_axis_groups_text_has_the_reference_tokens():
    """format_axis_groups' key=value tokens, as the reference's tests read them: the
    tiling the next compile gives while ops are pending, the compiled one after run(),
    and the DDP line first with data parallelism on."""
    x = torch.randn(4, 6)
    a = x.to("nntile")
    torch_nntile.set_axis_group_name(a, {0: "batch"})
    torch_nntile.set_axis_group_tiling("batch", [1, 1, 2])
    y = a * 2
    assert torch_nntile.has_pending_graph()
    text = torch_nntile.format_axis_groups()
    assert "name='batch'" in text and "pending_ntiles=3" in text and "pending_tiles=1,1,2" in text, text
    assert not text.startswith("DDP")
    torch_nntile.set_axis_group_tiling("batch", 2)
    torch_nntile.compile_graph()
    torch_nntile.run()
    torch_nntile.wait()
    assert not torch_nntile.has_pending_graph()
    text = torch_nntile.format_axis_groups()
    assert "name='batch'" in text and "ntiles=2" in text and "tiles=2,2" in text and " tile=" not in text, text
    assert "pending_" not in text, text
    torch_nntile.ddp("batch")  # 2 CPU workers in the tests: two replicas
    z = y + 1
    lines = torch_nntile.format_axis_groups().splitlines()
    assert lines[0] == "DDP axis='batch' replicas=2", lines
    assert "name='batch' extent=4" in lines[1] and lines[1].endswith(" pending_ntiles=2 pending_tiles=2,2"), lines
    torch_nntile.compile_graph()
    torch_nntile.run()
    torch_nntile.wait()
    text = torch_nntile.format_axis_groups()
    assert text.startswith("DDP axis='batch' replicas=2\n") and "ntiles=2 tiles=2,2" in text, text
    assert_close(z.cpu(), x * 2 + 1)


def test_deep_relu_presets_and_attributes():
    from torch_nntile.nn.model import DeepReLU

    tiny = DeepReLU.tiny()
    assert (tiny.input_dim, tiny.hidden_dim, tiny.output_dim, tiny.depth) == (128, 256, 10, 5)
    assert [tuple(p.shape) for p in tiny.parameters()] == [(256, 128), (256, 256), (256, 256), (256, 256), (10, 256)]
    mnist = DeepReLU.mnist(hidden_dim=64, depth=3)
    assert [tuple(p.shape) for p in mnist.parameters()] == [(64, 784), (64, 64), (10, 64)]
    one = DeepReLU(6, 99, 4, depth=1)
    assert [tuple(p.shape) for p in one.parameters()] == [(4, 6)]
    with pytest.raises(ValueError, match="DeepReLU: depth must be at least 1"):
        DeepReLU(6, 8, 4, depth=0)


def test_deep_relu_kaiming_init_is_the_same_on_any_device_and_trains_as_cpu():
    from torch_nntile.nn.model import DeepReLU

    cpu, dev = DeepReLU(20, 32, 5, depth=3), DeepReLU(20, 32, 5, depth=3).to("nntile")
    cpu.init_kaiming_uniform_(seed=7)
    dev.init_kaiming_uniform_(seed=7)
    for c, d in zip(cpu.parameters(), dev.parameters()):
        assert torch.equal(c, d.cpu())
        assert c.abs().max() <= c.shape[1] ** -0.5
    x = torch.randn(9, 20)
    want = cpu(x)
    got = dev(x.to("nntile"))
    assert_close(got.cpu(), want.detach())
    want.square().sum().backward()
    got.square().sum().backward()
    for c, d in zip(cpu.parameters(), dev.parameters()):
        assert_close(d.grad.cpu(), c.grad, 1e-4)


def _mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


@pytest.mark.parametrize("amsgrad, maximize", [(False, False), (True, True)])
def test_adam_matches_torch_optim_adam(amsgrad, maximize):
    from torch_nntile.training import Adam

    ref, cpu, dev = _mlp(), _mlp(), _mlp().to("nntile")
    kw = dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=amsgrad, maximize=maximize)
    opts = [torch.optim.Adam(ref.parameters(), **kw), Adam(cpu.parameters(), **kw), Adam(dev.parameters(), **kw)]
    x = torch.randn(5, 6)
    for _ in range(3):
        for model, opt in zip((ref, cpu, dev), opts):
            model(x.to(next(model.parameters()).device)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    for r, c, d in zip(ref.parameters(), cpu.parameters(), dev.parameters()):
        assert_close(c.detach(), r.detach(), 1e-6)
        assert_close(d.detach().cpu(), r.detach(), 1e-5)


def test_functional_steps_keep_their_state_and_match_the_optimizers():
    from torch_nntile import training

    for step, cls, kw in ((training.fused_sgd_step, torch.optim.SGD, dict(momentum=0.9)),
                          (training.fused_adam_step, torch.optim.Adam, dict(weight_decay=0.05)),
                          (training.fused_adamw_step, torch.optim.AdamW, dict())):
        ref, dev = _mlp(1), _mlp(1).to("nntile")
        ref_opt = cls(ref.parameters(), lr=0.05, **({"weight_decay": 0.01} if cls is torch.optim.AdamW else {}), **kw)
        x = torch.randn(4, 6)
        opt = None
        for _ in range(3):
            ref(x).sum().backward()
            ref_opt.step()
            ref_opt.zero_grad()
            dev(x.to("nntile")).sum().backward()
            got = step(list(dev.parameters()), 0.05, optimizer=opt, **kw)
            assert opt is None or got is opt  # the state carries over
            opt = got
            for p in dev.parameters():
                p.grad = None
        for r, d in zip(ref.parameters(), dev.parameters()):
            assert_close(d.detach().cpu(), r.detach(), 1e-5)


def test_train_full_batch_step_reference_form_and_weight_helpers():
    from torch_nntile import training

    ref, dev = _mlp(2), _mlp(2).to("nntile")
    x, labels = torch.randn(10, 6), torch.randint(0, 3, (10,))
    before = training.clone_model_weights(dev)
    assert all(t.device.type == "cpu" for t in before.values())
    seen = []
    want = []
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(2):
        loss = F.cross_entropy(ref(x), labels)
        want.append(loss.item())
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
    xd, ld = x.to("nntile"), labels.to("nntile")
    got = [training.train_full_batch_step(dev, xd, ld, 0.1),  # the rate in the optimizer's place
           training.train_full_batch_step(dev, xd, ld, learning_rate=0.1,
                                          name_axis_groups=lambda a, b: seen.append((a.shape, b.shape)),
                                          axis_group_tiling={})]
    assert got == pytest.approx(want, rel=1e-5)
    assert seen == [(torch.Size([10, 6]), torch.Size([10, 3]))]
    after = training.clone_model_weights(dev)
    assert training.max_weight_delta(after, training.clone_model_weights(ref)) < 1e-5
    assert training.max_weight_delta(before, after) > 0
    assert training.max_weight_delta({}, {}) == 0.0
    with pytest.raises(TypeError, match="not both"):
        training.train_full_batch_step(dev, xd, ld, 0.1, learning_rate=0.1)


def test_mse_loss_one_input_form():
    from torch_nntile.training import mse_loss

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    xd = x.to("nntile")
    assert mse_loss(xd).item() == pytest.approx(x.square().sum().item(), rel=1e-6)
    assert mse_loss(xd, scale=0.5).item() == pytest.approx(0.5 * x.square().sum().item(), rel=1e-6)
    assert mse_loss(xd, 2.0).item() == pytest.approx(2 * x.square().sum().item(), rel=1e-6)
    assert_close(mse_loss(xd, y.to("nntile")).cpu(), F.mse_loss(x, y))
    with pytest.raises(TypeError, match="scale= is for the one-input form"):
        mse_loss(xd, y.to("nntile"), scale=2.0)


def test_invalid_tiling_is_a_value_and_a_runtime_error():
    a = torch.randn(10, 3).to("nntile")
    torch_nntile.set_axis_group_name(a, {0: "rows_tiling_error"})
    for exc in (ValueError, RuntimeError, torch_nntile.TilingError):
        with pytest.raises(exc, match=r"tile sizes \[3, 3\] sum to 6, but the extent is 10"):
            torch_nntile.set_axis_group_tiling("rows_tiling_error", [3, 3])
    with pytest.raises(torch_nntile.TilingError, match="tile size must be positive"):
        torch_nntile.set_axis_group_tiling("rows_tiling_error", 0)


def _cpu_error(fn, *args, **kw) -> str:
    with pytest.raises(RuntimeError) as e:
        fn(*args, **kw)
    return str(e.value)


def test_errors_say_what_cpu_and_the_reference_say():
    """CPU's message first (PyTorch is the specification), then the published
    torch_nntile's words, which its users' tests match."""
    w = torch.randn(10, 4).to("nntile")
    with pytest.raises(RuntimeError, match=r"^Expected all tensors to be on the same device, but found tensors on cpu "
                                           r"and nntile:0 .*indices must be on device nntile"):
        F.embedding(torch.tensor([[1, 2]]), w)

    x, wt, b = torch.randn(2, 5), torch.randn(4, 5), torch.randn(3)
    want = _cpu_error(F.linear, x, wt, b)
    with pytest.raises(RuntimeError) as got:
        F.linear(x.to("nntile"), wt.to("nntile"), b.to("nntile"))
    assert str(got.value) == f"{want} (linear: bias size 3 does not match the 4 output features)"

    q, m = torch.randn(2, 3, 5, 8), torch.zeros(4, 1, 5, 5, dtype=torch.bool)
    want = _cpu_error(F.scaled_dot_product_attention, q, q, q, attn_mask=m)
    with pytest.raises(RuntimeError) as got:
        qn = q.to("nntile")
        F.scaled_dot_product_attention(qn, qn, qn, attn_mask=m.to("nntile")).cpu()
    assert str(got.value).startswith(want) and "does not broadcast" in str(got.value)
    ok = torch.zeros(2, 1, 5, 5, dtype=torch.bool)
    qn = q.to("nntile")
    assert_close(F.scaled_dot_product_attention(qn, qn, qn, attn_mask=ok.to("nntile")).cpu(),
                 F.scaled_dot_product_attention(q, q, q, attn_mask=ok))


def test_private_tiling_setter_checks_at_compile():
    """The reference's ``_set_axis_group_tiling`` checks the sizes when the graph compiles;
    the recorded ops stay pending and run once the tiling fits."""
    x = torch.randn(4, 8)
    a = x.to("nntile")
    torch_nntile.set_axis_group_name(a, {0: "batch_private"})
    y = a * 2
    torch_nntile._set_axis_group_tiling("batch_private", [1, 1, 1])
    with pytest.raises(RuntimeError, match="sum to 3, but the extent is 4"):
        torch_nntile.execute()
    assert torch_nntile.has_pending_graph()
    torch_nntile._set_axis_group_tiling("batch_private", [1, 3])
    assert_close(y.cpu(), x * 2)


def test_explicit_ncpu_wins_over_starpu_ncpu():
    """``STARPU_NCPU`` gives the default worker count; an explicit ``ncpu`` overrides it
    (StarPU alone would let the variable win), and the variable is left as it was."""
    code = ("import os, torch_nntile\nfrom torch_nntile.session import SESSION_STATE as S\n"
            "torch_nntile.init_context({arg})\nprint(S.runtime().ncpu, os.environ['STARPU_NCPU'])\n")
    env = {**os.environ, "STARPU_NCPU": "1"}
    for arg, want in (("ncpu=2", "2 1"), ("", "1 1")):
        out = run_python(code.format(arg=arg), env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == want.split(), out.stdout


def test_reference_loss_and_norm_modules():
    """``torch_nntile.loss`` / ``norm`` / ``normalization`` as the reference has them; its
    ``patch_*`` switches change nothing here (stock functions run on nntile already)."""
    import torch.nn.functional as TF

    from torch_nntile import loss, norm, normalization
    from torch_nntile.nn.functional import apply_nntile_patches

    x, y = torch.randn(4, 5), torch.randint(0, 5, (4,))
    for patch in (loss.patch_cross_entropy, norm.patch_vector_norm, normalization.patch_rms_norm,
                  apply_nntile_patches):
        assert patch() is None
    assert TF.cross_entropy is torch.nn.functional.cross_entropy
    xn, yn = x.to("nntile"), y.to("nntile")
    assert_close(loss.cross_entropy(xn, yn).cpu(), TF.cross_entropy(x, y))
    assert_close(loss.mse_loss(xn, scale=0.5).cpu(), 0.5 * x.square().sum())
    assert_close(norm.vector_norm(xn, dim=1).cpu(), torch.linalg.vector_norm(x, dim=1))
