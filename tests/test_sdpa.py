"""F.scaled_dot_product_attention on nntile: causal, float and bool masks, custom
scale, grouped KV heads, dropout drawn from the CPU generator; forward and backward
match CPU, untiled and with the batch and query dims tiled. Calls without a mask or
dropout run as the flash op (one recorded op each way, no ``[seq, seq]`` scores), in
the order q lies in memory; the others take ATen's math path, errors included."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close

import torch_nntile
from torch_nntile import stats

CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "scale": {"scale": 0.3},
    "float_mask": {"mask": (6, 6)},
    "bool_mask": {"mask": (2, 1, 6, 6), "bool": True},
    "grouped_kv": {"kv_heads": 2, "enable_gqa": True},
    "dropout": {"dropout_p": 0.3},
}


@pytest.mark.parametrize("tiled", [False, True], ids=["untiled", "tiled"])
@pytest.mark.parametrize("case", list(CASES))
def test_sdpa_matches_cpu(case, tiled):
    kw = dict(CASES[case])
    g = torch.Generator().manual_seed(0)
    kv = kw.pop("kv_heads", 4)
    q = torch.randn(2, 4, 6, 8, generator=g)
    k, v = torch.randn(2, kv, 6, 8, generator=g), torch.randn(2, kv, 6, 8, generator=g)
    mask = None
    if "mask" in kw:
        shape = kw.pop("mask")
        mask = torch.rand(shape, generator=g) > 0.3 if kw.pop("bool", False) else torch.randn(shape, generator=g)
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    dev = [t.to("nntile").requires_grad_() for t in (q, k, v)]
    if tiled:
        torch_nntile.set_axis_group_name(dev[0], {0: "sdpa_batch", 2: "sdpa_query"})
        torch_nntile.set_axis_group_tiling("sdpa_batch", 1)
        torch_nntile.set_axis_group_tiling("sdpa_query", [2, 4])
    torch.manual_seed(5)
    want = F.scaled_dot_product_attention(*cpu, attn_mask=mask, **kw)
    torch.manual_seed(5)
    got = F.scaled_dot_product_attention(*dev, attn_mask=None if mask is None else mask.to("nntile"), **kw)
    assert_close(got.detach().cpu(), want.detach())
    grad = torch.randn(want.shape, generator=g)
    want.backward(grad)
    got.backward(grad.to("nntile"))
    for d, c in zip(dev, cpu):
        assert_close(d.grad.cpu(), c.grad, rtol=1e-5)


# -- the flash path ---------------------------------------------------------------------

_SCORES = ("bmm", "_softmax", "matmul", "baddbmm")  # what the math path records


def _split_heads(b: int, s: int, h: int, d: int, device: str = "cpu") -> list[torch.Tensor]:
    """q, k, v as HF's attention makes them: slices of one projection, viewed [b, s, h, d]
    and transposed to [b, h, s, d]."""
    qkv = torch.randn(b, s, 3 * h * d, generator=torch.Generator().manual_seed(1)).to(device)
    return [t.view(b, s, h, d).transpose(1, 2) for t in qkv.split(h * d, dim=2)]


FUSED = {  # name -> (q shape, k shape, keywords); q and k [b, h, s, d] unless 3-D
    "plain": ((2, 4, 6, 8), (2, 4, 6, 8), {}),
    "causal": ((2, 4, 6, 8), (2, 4, 6, 8), {"is_causal": True}),
    "scale": ((2, 4, 6, 8), (2, 4, 6, 8), {"scale": 0.3}),
    "seq_q<seq_k_causal": ((2, 3, 4, 8), (2, 3, 7, 8), {"is_causal": True}),
    "seq_q>seq_k": ((2, 3, 7, 8), (2, 3, 4, 8), {}),
    "gqa": ((2, 6, 5, 4), (2, 2, 5, 4), {"enable_gqa": True, "is_causal": True}),
    "3d": ((3, 6, 8), (3, 5, 8), {}),
    "float64": ((2, 4, 6, 8), (2, 4, 6, 8), {"is_causal": True, "dtype": torch.float64}),
    "zero_batch": ((0, 4, 6, 8), (0, 4, 6, 8), {}),
    "no_keys": ((2, 4, 6, 8), (2, 4, 0, 8), {}),
    "no_queries": ((2, 4, 0, 8), (2, 4, 6, 8), {"is_causal": True}),
}
FUSED_TILES = {  # dim -> tile size of q (the last tile smaller where it does not divide)
    "untiled": {},
    "batch_heads_uneven": {0: 1, 1: 3},
    "seq": {2: 4},  # the op needs the sequence whole: re-tiled
}


def _tile_q(q: torch.Tensor, dims: dict[int, int]) -> None:
    for d, size in dims.items():
        if d < q.dim() and q.shape[d]:
            name = f"fused_sdpa_{d}"
            torch_nntile.set_axis_group_name(q, {d: name})
            torch_nntile.set_axis_group_tiling(name, size)


def _fused_matches_cpu(cpu: list[torch.Tensor], kw: dict, tiles: dict[int, int]) -> None:
    """CPU's SDPA and nntile's on the same leaves: values and gradients equal, and nntile
    recorded the flash op each way and none of the math path's."""
    rtol = 1e-12 if cpu[0].dtype == torch.float64 else 1e-5
    leaves = [t.detach().clone().requires_grad_() for t in cpu]
    dev = [t.detach().to("nntile").requires_grad_() for t in cpu]
    _tile_q(dev[0], tiles)
    before = len(torch_nntile.pending_op_names())
    want = F.scaled_dot_product_attention(*leaves, **kw)
    got = F.scaled_dot_product_attention(*dev, **kw)
    forward = torch_nntile.pending_op_names()[before:]
    assert forward.count("sdpa_fwd") == 1 and not set(forward) & set(_SCORES), forward
    assert got.shape == want.shape and got.dtype == want.dtype
    assert_close(got.detach().cpu(), want.detach(), rtol=rtol)
    grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(3), dtype=want.dtype)
    want.backward(grad)
    before = len(torch_nntile.pending_op_names())
    got.backward(grad.to("nntile"))
    assert torch_nntile.pending_op_names()[before:].count("sdpa_bwd") == 1
    for d, c in zip(dev, leaves):
        assert_close(d.grad.cpu(), c.grad, rtol=rtol)


@pytest.mark.parametrize("tiles", list(FUSED_TILES))
@pytest.mark.parametrize("case", list(FUSED))
def test_fused_sdpa_matches_cpu(case, tiles):
    qs, ks, kw = FUSED[case]
    kw = dict(kw)
    dtype = kw.pop("dtype", torch.float32)
    g = torch.Generator().manual_seed(len(case))
    cpu = [torch.randn(s, generator=g, dtype=dtype) for s in (qs, ks, ks)]
    _fused_matches_cpu(cpu, kw, FUSED_TILES[tiles])


@pytest.mark.parametrize("tiles", ["untiled", "batch_heads_uneven"])
def test_fused_sdpa_reads_hf_projections_in_place(tiles):
    """q, k, v sliced from one projection and transposed (HF's attention): read in their
    [b, s, h, d] order, with no permuting copy of them."""
    cpu = _split_heads(2, 6, 4, 8)
    _fused_matches_cpu(cpu, {"is_causal": True}, FUSED_TILES[tiles])
    dev = _split_heads(2, 6, 4, 8, "nntile")
    _tile_q(dev[0], FUSED_TILES[tiles])
    before = len(torch_nntile.pending_op_names())
    out = F.scaled_dot_product_attention(*dev, is_causal=True).transpose(1, 2).contiguous()
    assert "permute" not in torch_nntile.pending_op_names()[before:]
    assert_close(out.cpu(), F.scaled_dot_product_attention(*cpu, is_causal=True).transpose(1, 2))


def test_fused_sdpa_in_no_grad_and_inference_mode():
    cpu = [torch.randn(2, 4, 6, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    want = F.scaled_dot_product_attention(*cpu, is_causal=True)
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            dev = [t.to("nntile") for t in cpu]
            before = stats.OP_CALLS["torch_nntile::sdpa_fwd"]
            got = F.scaled_dot_product_attention(*dev, is_causal=True)
            assert stats.OP_CALLS["torch_nntile::sdpa_fwd"] == before + 1
            assert_close(got.cpu(), want)


@pytest.mark.parametrize("case", ["float_mask", "dropout"])
def test_masked_or_dropout_sdpa_takes_the_math_path(case):
    q = torch.randn(2, 4, 6, 8).to("nntile")
    kw = {"attn_mask": torch.randn(6, 6).to("nntile")} if case == "float_mask" else {"dropout_p": 0.5}
    before = len(torch_nntile.pending_op_names())
    F.scaled_dot_product_attention(q, q, q, **kw)
    names = torch_nntile.pending_op_names()[before:]
    assert "sdpa_fwd" not in names and "_softmax" in names


SDPA_ERRORS = {  # what CPU raises, nntile raises
    "dtypes": lambda: (torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8).double(), torch.randn(2, 4, 6, 8)),
    "heads_without_gqa": lambda: (torch.randn(2, 6, 5, 4), torch.randn(2, 4, 5, 4), torch.randn(2, 4, 5, 4)),
    "head_size": lambda: (torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 5), torch.randn(2, 4, 6, 5)),
    "one_dim": lambda: (torch.randn(8), torch.randn(8), torch.randn(8)),
}


@pytest.mark.parametrize("case", list(SDPA_ERRORS))
def test_sdpa_errors_match_cpu(case):
    args = SDPA_ERRORS[case]()
    with pytest.raises(Exception) as cpu:
        F.scaled_dot_product_attention(*args)
    with pytest.raises(type(cpu.value)) as ours:
        F.scaled_dot_product_attention(*(a.to("nntile") for a in args))
    assert str(ours.value).split("\n")[0] == str(cpu.value).split("\n")[0]
