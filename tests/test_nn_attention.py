"""torch_nntile's sdpa and rope (projection layout ``[batch, seq, head_size, heads]``)
against CPU PyTorch: torch's scaled_dot_product_attention (math backend) on the
permuted tensors, and HF's rotate_half rope. Forward and backward, on CPU tensors
and on nntile, untiled and tiled (batch, heads, uneven, seq and head_size tiled by
the user, which the ops re-tile); one recorded op per call; errors."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_nntile
from torch_nntile.nn.attention import sdpa
from torch_nntile.rope import rope as rope_any_layout

_names = itertools.count()


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The projection layout's rope in its argument order (``rope`` takes ``sin, cos, x``)."""
    return rope_any_layout(x=x, cos=cos, sin=sin, layout="projection")


def _tile(t: torch.Tensor, dims: dict[int, int | list[int]]) -> None:
    for d, sizes in dims.items():
        name = f"attn{next(_names)}"
        torch_nntile.set_axis_group_name(t, {d: name})
        torch_nntile.set_axis_group_tiling(name, sizes)


def _compare(ours, ref, inputs: list[torch.Tensor], n_grad: int, tiles: dict[int, dict] | None = None,
             rtol: float = 1e-5) -> None:
    """``ours`` on nntile (inputs tiled per ``tiles``: input index -> dim -> sizes) and
    on CPU tensors equals ``ref`` on CPU, forward and the gradients of the first
    ``n_grad`` inputs."""
    def leaves(device: str) -> list[torch.Tensor]:
        return [x.detach().to(device).requires_grad_(i < n_grad) for i, x in enumerate(inputs)]

    ref_in, cpu_in, dev_in = leaves("cpu"), leaves("cpu"), leaves("nntile")
    for i, dims in (tiles or {}).items():
        _tile(dev_in[i], dims)
    want = ref(*ref_in)
    got_cpu, got = ours(*cpu_in), ours(*dev_in)
    assert got.device.type == "nntile"
    assert_close(got_cpu.detach(), want.detach(), rtol)
    assert_close(got.detach().cpu(), want.detach(), rtol)
    g = torch.randn(want.shape, dtype=want.dtype)
    want.backward(g)
    got_cpu.backward(g)
    got.backward(g.to("nntile"))
    for r, c, d in zip(ref_in[:n_grad], cpu_in, dev_in):
        assert_close(c.grad, r.grad, rtol)
        assert d.grad is not None and d.grad.device.type == "nntile"
        assert_close(d.grad.cpu(), r.grad, rtol)


# -- sdpa ---------------------------------------------------------------------------


def _ref_sdpa(q, k, v, is_causal=False, scale=None):
    """torch's math attention on ``[b, h, s, d]``; kv heads repeated as HF's repeat_kv."""
    rep = q.shape[3] // max(k.shape[3], 1)
    qh, kh, vh = (t.permute(0, 3, 1, 2) for t in (q, k, v))
    kh, vh = kh.repeat_interleave(rep, 1), vh.repeat_interleave(rep, 1)
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=is_causal, scale=scale)
    return out.permute(0, 2, 3, 1)


def _qkv(b=2, sq=6, sk=6, d=8, h=4, kv=4, dtype=torch.float32):
    g = torch.Generator().manual_seed(b * 1000 + sq * 100 + sk * 10 + h + kv)
    return [torch.randn(b, s, d, n, generator=g, dtype=dtype) for s, n in ((sq, h), (sk, kv), (sk, kv))]


SDPA_CASES = {
    "plain": ({}, {}),
    "causal": ({}, {"is_causal": True}),
    "scale": ({}, {"scale": 0.3}),
    "seq_q<seq_k": ({"sq": 5, "sk": 7}, {}),
    "seq_q>seq_k": ({"sq": 7, "sk": 3}, {}),
    "causal_seq_q<seq_k": ({"sq": 4, "sk": 7}, {"is_causal": True}),  # top-left aligned
    "causal_seq_q>seq_k": ({"sq": 7, "sk": 4}, {"is_causal": True}),
    "gqa": ({"kv": 2}, {"is_causal": True}),
    "mqa": ({"kv": 1}, {}),
    "float64": ({"dtype": torch.float64}, {"is_causal": True}),
    "zero_batch": ({"b": 0}, {}),
    "no_keys": ({"sk": 0}, {}),
    "no_queries": ({"sq": 0}, {"is_causal": True}),
    "no_heads": ({"h": 0, "kv": 0}, {}),
}

SDPA_TILES = {  # tile sizes (not lists) fit every case's shapes; the last tile is smaller
    "untiled": None,
    "batch": {0: {0: 1}},
    "batch_heads_uneven": {0: {0: 1, 3: 3}},
    "seq_and_head_size": {0: {1: 4, 2: 3}, 1: {1: 3}},  # re-tiled whole
}


@pytest.mark.parametrize("tiles", list(SDPA_TILES))
@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_sdpa_matches_torch(case, tiles):
    shape, kw = SDPA_CASES[case]
    q, k, v = _qkv(**shape)
    rtol = 1e-12 if q.dtype == torch.float64 else 1e-5
    _compare(lambda *t: sdpa(*t, **kw), lambda *t: _ref_sdpa(*t, **kw), [q, k, v], 3, SDPA_TILES[tiles], rtol)


@pytest.mark.parametrize("heads", [[1, 3], [2, 2], [1, 1, 2], 1])
def test_sdpa_gqa_head_tiles(heads):
    """q head tiles that split a kv group are merged to whole groups; kv heads re-tiled."""
    q, k, v = _qkv(b=2, sq=5, sk=5, h=4, kv=2)
    _compare(lambda *t: sdpa(*t, is_causal=True), lambda *t: _ref_sdpa(*t, is_causal=True), [q, k, v], 3,
             {0: {0: 1, 3: heads}})


def test_sdpa_records_one_op_each_way():
    q, k, v = (t.to("nntile").requires_grad_() for t in _qkv())
    _tile(q, {0: 1, 3: 2})
    before = torch_nntile.pending_op_names()
    out = sdpa(q, k, v, is_causal=True)
    assert torch_nntile.pending_op_names()[len(before):] == ["sdpa_fwd"]
    g = torch.randn(out.shape).to("nntile")
    before = torch_nntile.pending_op_names()
    out.backward(g)
    assert torch_nntile.pending_op_names()[len(before):] == ["sdpa_bwd"]
    tasks = {n: _tasks(n) for n in ("sdpa_fwd", "sdpa_bwd")}
    q.grad.cpu()
    for n, t in tasks.items():
        assert _tasks(n) - t == 4  # one per (batch tile, head tile)


def _tasks(kernel: str) -> int:
    return int(torch_nntile.metrics()["kernels"].get(kernel, {}).get("tasks", 0))


def test_sdpa_retile_is_counted():
    q, k, v = (t.to("nntile") for t in _qkv())
    _tile(q, {1: 3})  # seq tiled: the op needs it whole
    before = sum(torch_nntile.metrics()["retiles"].get("sdpa_fwd", {}).values())
    out = sdpa(q, k, v)
    torch_nntile.execute()
    torch_nntile.wait()
    assert sum(torch_nntile.metrics()["retiles"].get("sdpa_fwd", {}).values()) > before
    assert_close(out.cpu(), _ref_sdpa(*_qkv()))


# -- rope ---------------------------------------------------------------------------


def _rotate_half(t: torch.Tensor) -> torch.Tensor:
    half = t.shape[2] // 2
    return torch.cat((-t[:, :, half:], t[:, :, :half]), dim=2)


def _ref_rope(x, cos, sin):
    return x * cos[..., None] + _rotate_half(x) * sin[..., None]


def _rope_inputs(b=2, s=6, d=8, h=4, cos_batch=None):
    g = torch.Generator().manual_seed(7)
    lead = (s, d) if cos_batch is None else (cos_batch, s, d)
    return [torch.randn(b, s, d, h, generator=g), torch.randn(lead, generator=g), torch.randn(lead, generator=g)]


ROPE_CASES = {
    "cos_2d": {},
    "cos_per_batch": {"cos_batch": 2},
    "cos_batch_1": {"cos_batch": 1},  # what HF Llama's rotary embedding returns
    "zero_batch": {"b": 0},
}

ROPE_TILES = {
    "untiled": None,
    "batch_seq_heads": {0: {0: 1, 1: 4, 3: 3}},
    "head_size": {0: {2: 3}},  # re-tiled whole
}


@pytest.mark.parametrize("tiles", list(ROPE_TILES))
@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_rope_matches_hf(case, tiles):
    _compare(rope, _ref_rope, _rope_inputs(**ROPE_CASES[case]), 1, ROPE_TILES[tiles])


def test_rope_records_one_op_each_way():
    x, cos, sin = _rope_inputs()
    x = x.to("nntile").requires_grad_()
    cos, sin = cos.to("nntile"), sin.to("nntile")
    _tile(x, {1: [2, 4], 2: [4, 4]})
    before = torch_nntile.pending_op_names()
    y = rope(x, cos, sin)
    assert torch_nntile.pending_op_names()[len(before):] == ["rope_fwd"]
    g = torch.randn(y.shape).to("nntile")
    before = torch_nntile.pending_op_names()
    y.backward(g)
    assert torch_nntile.pending_op_names()[len(before):] == ["rope_bwd"]
    x0, c0, s0 = _rope_inputs()
    gc = g.cpu()
    assert_close(x.grad.cpu(), gc * c0[..., None] - _rotate_half(gc * s0[..., None]))


# -- errors (the same exception on CPU and nntile) -----------------------------------


ERRORS = {
    "rope_odd_head_size": (lambda: (rope, [torch.randn(2, 3, 5, 2), torch.randn(3, 5), torch.randn(3, 5)]),
                           ValueError, "even"),
    "rope_cos_shape": (lambda: (rope, [torch.randn(2, 3, 4, 2), torch.randn(4, 4), torch.randn(4, 4)]),
                       ValueError, "cos and sin"),
    "rope_sin_shape": (lambda: (rope, [torch.randn(2, 3, 4, 2), torch.randn(3, 4), torch.randn(2, 3, 4)]),
                       ValueError, "same shape"),
    "rope_not_4d": (lambda: (rope, [torch.randn(3, 4, 2), torch.randn(3, 4), torch.randn(3, 4)]),
                    ValueError, "4-D"),
    "sdpa_head_size": (lambda: (sdpa, [torch.randn(2, 3, 4, 2), torch.randn(2, 3, 5, 2), torch.randn(2, 3, 5, 2)]),
                       ValueError, "head_size"),
    "sdpa_heads": (lambda: (sdpa, [torch.randn(2, 3, 4, 3), torch.randn(2, 3, 4, 2), torch.randn(2, 3, 4, 2)]),
                   ValueError, "multiple"),
    "sdpa_kv_shape": (lambda: (sdpa, [torch.randn(2, 3, 4, 2), torch.randn(2, 3, 4, 2), torch.randn(2, 4, 4, 2)]),
                      ValueError, "same shape"),
    "sdpa_not_4d": (lambda: (sdpa, [torch.randn(3, 4, 2), torch.randn(3, 4, 2), torch.randn(3, 4, 2)]),
                    ValueError, "4-D"),
    "sdpa_dtype": (lambda: (sdpa, [torch.randn(2, 3, 4, 2), torch.randn(2, 3, 4, 2).double(),
                                   torch.randn(2, 3, 4, 2)]), TypeError, "dtype"),
}


@pytest.mark.parametrize("device", ["cpu", "nntile"])
@pytest.mark.parametrize("case", list(ERRORS))
def test_errors(case, device):
    make, exc, match = ERRORS[case]
    fn, args = make()
    with pytest.raises(exc, match=match):
        fn(*(a.to(device) for a in args))
    assert torch_nntile.pending_op_names().count("sdpa_fwd") + torch_nntile.pending_op_names().count("rope_fwd") == 0
