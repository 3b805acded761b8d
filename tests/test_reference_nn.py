"""The published torch_nntile's nn helpers (issue 45, part 4) against CPU PyTorch:
``gemm``, ``add_fiber``, ``functional.add`` / ``gelu(approximate=)``,
``normalization.rms_norm``, ``rope(sin, cos, x)`` with its pairs layout and
``rope_sin_cos_from_position_ids``, ``nn.sdpa_eager`` and the attention weight
converters of ``nn.weight_layout`` and ``nn.linear``. Forward and backward on CPU
tensors and on nntile, untiled and tiled."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
import torch.nn.functional as TF
from conftest import assert_close, run_python

import torch_nntile
from torch_nntile.add_fiber import add_fiber
from torch_nntile.gemm import gemm
from torch_nntile.nn import SDPA, linear, sdpa_eager, weight_layout
from torch_nntile.nn import functional as F
from torch_nntile.normalization import rms_norm
from torch_nntile.rope import rope, rope_sin_cos_from_position_ids

_names = itertools.count()


def _tile(t: torch.Tensor, dims: dict[int, int]) -> None:
    for d, size in dims.items():
        name = f"refnn{next(_names)}"
        torch_nntile.set_axis_group_name(t, {d: name})
        torch_nntile.set_axis_group_tiling(name, size)


def _check(ours, ref, inputs: list[torch.Tensor], n_grad: int, tiles: dict[int, dict[int, int]] | None = None,
           cpu: bool = True, rtol: float = 1e-5) -> None:
    """``ours`` on nntile (input ``i`` tiled per ``tiles[i]``) and, with ``cpu``, on CPU
    tensors equals ``ref`` on CPU, forward and the first ``n_grad`` inputs' gradients."""
    def leaves(device: str) -> list[torch.Tensor]:
        return [t.detach().to(device).requires_grad_(i < n_grad and t.is_floating_point())
                for i, t in enumerate(inputs)]

    runs = [("cpu", leaves("cpu"))] if cpu else []
    runs.append(("nntile", leaves("nntile")))
    for i, dims in (tiles or {}).items():
        _tile(runs[-1][1][i], dims)
    ref_in = leaves("cpu")
    want = ref(*ref_in)
    g = torch.randn(want.shape, dtype=want.dtype)
    want.backward(g)
    for device, xs in runs:
        got = ours(*xs)
        assert got.device.type == device
        assert_close(got.detach().cpu(), want.detach(), rtol)
        got.backward(g.to(device))
        for r, d in zip(ref_in[:n_grad], xs):
            assert d.grad is not None and d.grad.device.type == device
            assert_close(d.grad.cpu(), r.grad, rtol)


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed + sum(shape)))


# -- gemm ---------------------------------------------------------------------------------

GEMM_CASES = {  # a, b, kwargs, einsum of the reference
    "qkv_projection": ((2, 6, 8), (8, 4, 3), {"ndim": 1}, "bsh,hdn->bsdn"),
    "output_projection": ((2, 6, 4, 3), (4, 3, 8), {"ndim": 2}, "bsdn,dno->bso"),
    "linear_trans_b": ((2, 6, 8), (5, 8), {"ndim": 1, "trans_b": True}, "bsi,oi->bso"),
    "trans_a": ((8, 2, 3), (8, 5), {"ndim": 1, "trans_a": True}, "kmn,kp->mnp"),
    "batched": ((3, 4, 5), (3, 5, 6), {"ndim": 1, "batch_ndim": 1}, "bmk,bkn->bmn"),
    "batched_both_trans": ((3, 5, 2, 4), (3, 6, 5, 2), {"ndim": 2, "batch_ndim": 1, "trans_a": True,
                                                         "trans_b": True}, "bklm,bnkl->bmn"),
}
GEMM_TILES = {"untiled": None, "tiled": {0: {0: 1, 1: 2}}}


@pytest.mark.parametrize("tiles", list(GEMM_TILES))
@pytest.mark.parametrize("case", list(GEMM_CASES))
def test_gemm_matches_einsum(case, tiles):
    sa, sb, kw, eq = GEMM_CASES[case]
    _check(lambda a, b: gemm(a, b, **kw), lambda a, b: torch.einsum(eq, a, b), [_rand(*sa), _rand(*sb, seed=1)], 2,
           GEMM_TILES[tiles])


def test_gemm_in_functional_and_errors():
    assert F.gemm is gemm
    with pytest.raises(ValueError, match="contracted"):
        gemm(torch.randn(2, 3), torch.randn(4, 5), ndim=1)
    with pytest.raises(ValueError, match="batch"):
        gemm(torch.randn(2, 3, 4), torch.randn(3, 4, 5), ndim=1, batch_ndim=1)
    with pytest.raises(ValueError, match="do not fit"):
        gemm(torch.randn(3), torch.randn(3, 4), ndim=2)


# -- add_fiber, add ------------------------------------------------------------------------

FIBER_CASES = {  # tensor shape, fiber shape, kwargs, the fiber's view for broadcasting
    "bias_last": ((2, 4, 8), (8,), {"axis": 2}, (1, 1, 8)),
    "qkv_bias": ((4, 2, 6, 8), (4, 8), {"axis": 3, "batch_ndim": 1}, (4, 1, 1, 8)),
    "middle_scaled": ((3, 5, 2), (5,), {"axis": 1, "alpha": 0.5, "beta": -2.0}, (1, 5, 1)),
}


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("case", list(FIBER_CASES))
def test_add_fiber_matches_broadcast(case, tiled):
    shape, fshape, kw, view = FIBER_CASES[case]
    alpha, beta = kw.get("alpha", 1.0), kw.get("beta", 1.0)
    _check(lambda f, x: add_fiber(f, x, **kw), lambda f, x: alpha * f.reshape(view) + beta * x,
           [_rand(*fshape), _rand(*shape, seed=1)], 2, {1: {0: 1, len(shape) - 1: 3}} if tiled else None)


def test_add_fiber_errors():
    assert F.add_fiber is add_fiber
    with pytest.raises(ValueError, match="does not fit"):
        add_fiber(torch.randn(3), torch.randn(2, 4), axis=1)
    with pytest.raises(ValueError, match="does not fit"):
        add_fiber(torch.randn(2), torch.randn(2, 4), axis=0, batch_ndim=1)


@pytest.mark.parametrize("alpha, beta", [(1.0, 1.0), (2.0, -0.5)])
def test_add(alpha, beta):
    _check(lambda x, y: F.add(x, y, alpha=alpha, beta=beta), lambda x, y: alpha * x + beta * y,
           [_rand(3, 4), _rand(3, 4, seed=1)], 2, {0: {0: 2}})


# -- gelu, rms_norm -----------------------------------------------------------------------


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_approximate(approximate):
    _check(lambda x: F.gelu(x, approximate=approximate), lambda x: TF.gelu(x, approximate=approximate),
           [_rand(4, 6)], 1, {0: {0: 3}})
    x = _rand(5)
    assert_close(F.gelu(x), TF.gelu(x))  # the default is exact, as F.gelu's
    assert_close(F.gelutanh(x), TF.gelu(x, approximate="tanh"))
    assert_close(torch_nntile.nn.GELU(approximate=approximate)(x.to("nntile")).cpu(),
                 TF.gelu(x, approximate=approximate))
    with pytest.raises(ValueError, match="approximate"):
        F.gelu(x, approximate="erf")


@pytest.mark.parametrize("tiled", [False, True])
def test_normalization_rms_norm(tiled):
    _check(lambda x, w: rms_norm(input=x, normalized_shape=[6], weight=w, eps=1e-6),
           lambda x, w: TF.rms_norm(x, [6], w, 1e-6), [_rand(3, 4, 6), _rand(6, seed=1)], 2,
           {0: {0: 2, 1: 3}} if tiled else None)
    x = _rand(2, 5)
    assert_close(rms_norm(x.to("nntile"), 5).cpu(), TF.rms_norm(x, [5]))


# -- rope -----------------------------------------------------------------------------------


def _rope_pairs_ref(sin, cos, x):
    xe, xo = x[..., 0::2], x[..., 1::2]
    return torch.stack([cos * xe - sin * xo, sin * xe + cos * xo], -1).flatten(-2)


def _angles(b: int, s: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.arange(s).unsqueeze(0).expand(b, s) + torch.arange(b).unsqueeze(1)
    return rope_sin_cos_from_position_ids(pos, head_dim, rope_theta=500.0)


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("sin_shape", ["full", "broadcast_heads"])
def test_rope_pairs_layout(sin_shape, tiled):
    """x ``[batch, heads, seq, head_dim]``, sin/cos ``[batch, heads or 1, seq, head_dim // 2]``."""
    b, h, s, d = 2, 3, 5, 8
    sin, cos = (t.unsqueeze(1) for t in _angles(b, s, d))
    if sin_shape == "full":
        sin, cos = sin.expand(b, h, s, d // 2).contiguous(), cos.expand(b, h, s, d // 2).contiguous()
    x = _rand(b, h, s, d).requires_grad_()
    y = _rope_pairs_ref(sin, cos, x)
    g = torch.randn(y.shape)
    y.backward(g)
    for device in ("cpu", "nntile"):
        xd = x.detach().to(device).requires_grad_()
        if tiled and device == "nntile":
            _tile(xd, {0: 1, 2: 3})
        yd = rope(sin.to(device), cos.to(device), xd)
        assert yd.device.type == device
        assert_close(yd.detach().cpu(), y.detach())
        yd.backward(g.to(device))
        assert_close(xd.grad.cpu(), x.grad)


def test_rope_projection_layout_by_keywords():
    """Today's ``[batch, seq, head_size, heads]`` form, reached by keywords (or ``layout=``)."""
    x, cos, sin = _rand(2, 6, 8, 4), _rand(6, 8, seed=1), _rand(6, 8, seed=2)
    half = 4
    want = x * cos[..., None] + torch.cat((-x[:, :, half:], x[:, :, :half]), 2) * sin[..., None]
    for device in ("cpu", "nntile"):
        xd, cd, sd = (t.to(device) for t in (x, cos, sin))
        assert_close(rope(x=xd, cos=cd, sin=sd).cpu(), want)
        assert_close(rope(sd, cd, xd, layout="projection").cpu(), want)
        assert_close(F.rope(sin=sd, cos=cd, x=xd).cpu(), want)


def test_rope_layout_errors():
    x = torch.randn(2, 4, 4, 8)  # heads = 2 * head_size, and seq = head_size: both layouts fit
    sin = torch.randn(4, 4)
    with pytest.raises(ValueError, match="both layouts"):
        rope(sin, sin, x)
    assert rope(sin, sin, x, layout="pairs").shape == x.shape
    with pytest.raises(ValueError, match="layout must be"):
        rope(sin, sin, x, layout="interleaved")
    with pytest.raises(ValueError, match="head_dim // 2"):
        rope(torch.randn(3, 3), torch.randn(3, 3), torch.randn(3, 8))
    with pytest.raises(ValueError, match="even"):
        rope_sin_cos_from_position_ids(torch.arange(3)[None], 5)


def test_rope_sin_cos_from_position_ids():
    pos = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])
    sin, cos = rope_sin_cos_from_position_ids(pos, 8, rope_theta=10000.0)
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, 8, 2).float() / 8)  # HF's default rotary frequencies
    angles = pos.float()[..., None] * inv_freq
    assert sin.shape == cos.shape == (2, 4, 4) and sin.dtype == torch.float32
    assert_close(sin, angles.sin())
    assert_close(cos, angles.cos())
    sn, cn = rope_sin_cos_from_position_ids(pos.to("nntile"), 8)
    assert sn.device.type == "nntile"
    assert_close(sn.cpu(), sin)
    assert_close(cn.cpu(), cos)
    sp, cp = rope_sin_cos_from_position_ids(pos, 8, identity_pad_head_dim=12)
    assert sp.shape == (2, 4, 6)
    assert torch.equal(sp[..., 4:], torch.zeros(2, 4, 2)) and torch.equal(cp[..., 4:], torch.ones(2, 4, 2))
    assert torch.equal(sp[..., :4], sin)


# -- sdpa_eager -----------------------------------------------------------------------------


def _sdpa_ref(q, k, v, mask=None, batch_ndim=2):
    """Attention on ``[..., seq, head_size, heads]``: heads first, scale 1/sqrt(head_size)."""
    lead = q.dim() - 3
    to_heads = [*range(lead), q.dim() - 1, lead, lead + 1]
    qh, kh, vh = (t.permute(to_heads) for t in (q, k, v))
    rep = qh.shape[-3] // kh.shape[-3]
    kh, vh = kh.repeat_interleave(rep, -3), vh.repeat_interleave(rep, -3)
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-2])
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    out = torch.softmax(scores, -1) @ vh
    return out.permute(*range(lead), lead + 1, lead + 2, lead)


SDPA_CASES = {  # q shape, kv heads, batch_ndim, masked
    "plain": ((2, 6, 8, 4), 4, 2, False),
    "causal_mask": ((2, 6, 8, 4), 4, 2, True),
    "gqa_mask": ((2, 5, 4, 4), 2, 2, True),
    "no_batch": ((6, 8, 2), 2, 1, False),
    "two_batch_axes_mask": ((2, 3, 5, 4, 2), 2, 3, True),
}


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_sdpa_eager_matches_reference(case, tiled):
    shape, kv_heads, batch_ndim, masked = SDPA_CASES[case]
    seq = shape[-3]
    kv = (*shape[:-1], kv_heads)
    mask = torch.ones(seq, seq, dtype=torch.bool).tril() if masked else None
    inputs = [_rand(*shape), _rand(*kv, seed=1), _rand(*kv, seed=2)] + ([mask] if masked else [])
    tiles = {0: {0: 1, batch_ndim + 1: 2}} if tiled and batch_ndim > 1 else None
    _check(lambda q, k, v, *m: sdpa_eager(q, k, v, *m, batch_ndim=batch_ndim),
           lambda q, k, v, *m: _sdpa_ref(q, k, v, *m), inputs, 3, tiles, cpu=False)


def test_sdpa_eager_mask_is_query_by_key():
    q, k, v = _rand(1, 5, 8, 1), _rand(1, 5, 8, 1, seed=1), _rand(1, 5, 8, 1, seed=2)
    mask = torch.zeros(5, 5, dtype=torch.bool)
    mask[:, 0] = True
    mask[2, 3] = True
    got = sdpa_eager(*(t.to("nntile") for t in (q, k, v, mask)))
    assert_close(got.cpu(), _sdpa_ref(q, k, v, mask))
    assert not torch.allclose(got.cpu(), _sdpa_ref(q, k, v, mask.t().contiguous()))


def test_sdpa_eager_errors_and_module():
    q = torch.randn(1, 4, 8, 2)
    with pytest.raises(ValueError, match="nntile"):
        sdpa_eager(q, q, q)
    qn = q.to("nntile")
    with pytest.raises(ValueError, match="bool"):
        sdpa_eager(qn, qn, qn, torch.zeros(4, 4).to("nntile"))
    cpu_mask = torch.ones(4, 4, dtype=torch.bool).tril()  # a CPU mask is moved, as the reference's
    assert_close(sdpa_eager(qn, qn, qn, cpu_mask).cpu(), _sdpa_ref(q, q, q, cpu_mask))
    with pytest.raises(ValueError, match="rank"):
        sdpa_eager(qn, qn, qn, batch_ndim=3)
    assert F.sdpa_eager is sdpa_eager
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    assert_close(SDPA(batch_ndim=2)(qn, qn, qn, mask.to("nntile")).cpu(), _sdpa_ref(q, q, q, mask))
    assert_close(SDPA(batch_ndim=2)(qn, qn, qn).cpu(), _sdpa_ref(q, q, q))


# -- weight layouts -------------------------------------------------------------------------


def test_attn_weight_converters_round_trip():
    hidden, n_heads, head_size = 12, 3, 4
    w, o = torch.randn(hidden, n_heads, head_size), torch.randn(n_heads, head_size, hidden)
    wn, on = weight_layout.torch_to_nntile_qkv_weight(w), weight_layout.torch_to_nntile_o_weight(o)
    assert wn.shape == (hidden, head_size, n_heads) and on.shape == (head_size, n_heads, hidden)
    assert torch.equal(wn, w.transpose(1, 2)) and torch.equal(on, o.transpose(0, 1))
    assert torch.equal(weight_layout.nntile_to_torch_qkv_weight(wn), w)
    assert torch.equal(weight_layout.nntile_to_torch_o_weight(on), o)
    with pytest.raises(ValueError, match="3D"):
        weight_layout.torch_to_nntile_qkv_weight(torch.randn(4, 4))
    sd = {"l.attn.q_weight": w, "l.attn.v_weight": w, "l.attn.o_weight": o, "l.attn.q_bias": torch.randn(3, 4),
          "other.q_weight": w}
    out = weight_layout.convert_attn_weights(sd, "torch_to_nntile", prefix="l")
    assert out["l.attn.q_weight"].shape == (hidden, head_size, n_heads) and torch.equal(out["other.q_weight"], w)
    assert out["l.attn.q_bias"] is sd["l.attn.q_bias"]
    back = torch_nntile.nn.convert_attn_weights(out, "nntile_to_torch")
    assert all(torch.equal(back[k], sd[k]) for k in sd if k.startswith("l."))
    with pytest.raises(ValueError, match="direction"):
        weight_layout.convert_attn_weights(sd, "hf_to_nntile")


def test_linear_converters_round_trip_and_match_hf():
    n_kv, n_rep, hs, hidden, b, s = 2, 2, 3, 8, 2, 5
    nh = n_kv * n_rep
    wq, wo, bq = torch.randn(nh * hs, hidden), torch.randn(hidden, nh * hs), torch.randn(nh * hs)
    x, attn = torch.randn(b, s, hidden), torch.randn(b, s, hs, nh)
    q = linear.linear_to_qkv_weight(wq, n_heads=nh, head_size=hs)
    assert q.shape == (hidden, hs, nh)
    # the projection lands in [batch, seq, head_size, heads]: HF's head h, feature d
    assert_close(gemm(x, q, ndim=1), (x @ wq.T).reshape(b, s, nh, hs).transpose(2, 3))
    o = linear.linear_to_output_weight(wo, n_heads=nh, head_size=hs)
    assert_close(gemm(attn, o, ndim=2), attn.transpose(2, 3).reshape(b, s, nh * hs) @ wo.T, rtol=1e-5)
    assert torch.equal(linear.qkv_to_linear_weight(q), wq) and torch.equal(linear.output_to_linear_weight(o), wo)
    bias = linear.linear_to_qkv_bias(bq, n_heads=nh, head_size=hs)
    assert bias.shape == (nh, hs) and torch.equal(linear.qkv_to_linear_bias(bias), bq)
    gq = linear.linear_to_gqa_q_weight(wq, n_kv_heads=n_kv, n_rep=n_rep, head_size=hs)
    go = linear.linear_to_gqa_output_weight(wo, n_kv_heads=n_kv, n_rep=n_rep, head_size=hs)
    assert gq.shape == (hidden, hs, n_kv, n_rep) and go.shape == (hs, n_kv, n_rep, hidden)
    assert torch.equal(gq.reshape(hidden, hs, nh), q) and torch.equal(go.reshape(hs, nh, hidden), o)
    assert torch.equal(linear.gqa_q_to_linear_weight(gq), wq) and torch.equal(linear.gqa_output_to_linear_weight(go), wo)


def test_linear_modules_and_mask():
    torch.manual_seed(0)
    lin = linear.NntileLinear(8, 5)
    x = torch.randn(2, 3, 8)
    want = TF.linear(x, lin.weight, lin.bias)
    want.sum().backward()
    dev = linear.NntileLinear(8, 5).to("nntile")
    dev.load_state_dict(lin.state_dict())
    got = dev(x.to("nntile"))
    got.sum().backward()
    assert_close(got.detach().cpu(), want.detach())
    assert_close(dev.weight.grad.cpu(), lin.weight.grad)
    assert_close(dev.bias.grad.cpu(), lin.bias.grad)
    qkv, out = linear.NntileQKVProjection(8, 2, 4), linear.NntileAttentionOutput(2, 4, 8)
    for m in (qkv, out):
        torch.nn.init.normal_(m.bias)
    want = (torch.einsum("bsh,hdn->nbsd", x, qkv.weight.detach()) + qkv.bias.detach()[:, None, None])
    for device in ("cpu", "nntile"):
        heads_first = copy.deepcopy(qkv).to(device)(x.to(device))
        assert heads_first.shape == (4, 2, 3, 2)
        assert_close(heads_first.detach().cpu(), want)
        y = copy.deepcopy(out).to(device)(heads_first)
        assert_close(y.detach().cpu(), torch.einsum("nbsd,dno->bso", want, out.weight.detach()) + out.bias.detach())
    causal = linear.prepare_sdpa_mask(None, x.to("nntile"), q_len=3, is_causal=True)
    assert causal.device.type == "nntile" and torch.equal(causal.cpu(), torch.ones(3, 3, dtype=torch.bool).tril())
    additive = torch.zeros(2, 1, 3, 3).masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), -math.inf)
    assert torch.equal(linear.prepare_sdpa_mask(additive, x, q_len=3), torch.ones(3, 3, dtype=torch.bool).tril())
    assert linear.prepare_sdpa_mask(None, x, q_len=3) is None


def test_imports_need_no_transformers():
    r = run_python("""
        import sys
        sys.modules["transformers"] = None  # importing it raises
        import torch_nntile.gemm, torch_nntile.add_fiber, torch_nntile.normalization, torch_nntile.rope
        import torch_nntile.nn.linear, torch_nntile.nn.weight_layout
        from torch_nntile.nn import sdpa_eager, convert_attn_weights
        from torch_nntile.nn.functional import add, gemm, gelu, rope_sin_cos_from_position_ids
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_rope_reference_oracles_match_rope():
    """The published torch_nntile's private oracles ``_rope_ref_forward`` / ``_backward``."""
    from torch_nntile.rope import _rope_ref_backward, _rope_ref_forward

    sin, cos = rope_sin_cos_from_position_ids(torch.arange(5)[None], 8)
    x = torch.randn(2, 5, 8)
    grad = torch.randn(2, 5, 8)
    xd = x.to("nntile").requires_grad_()
    y = rope(sin.to("nntile"), cos.to("nntile"), xd)
    y.backward(grad.to("nntile"))
    assert_close(y.detach().cpu(), _rope_ref_forward(sin, cos, x))
    assert_close(xd.grad.cpu(), _rope_ref_backward(sin, cos, grad))
