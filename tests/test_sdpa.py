"""F.scaled_dot_product_attention on nntile (math path): causal, float and bool masks,
custom scale, grouped KV heads, dropout drawn from the CPU generator; forward and
backward match CPU, untiled and with the batch and query dims tiled."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close

import torch_nntile

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
