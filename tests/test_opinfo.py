"""PyTorch's OpInfo database as the conformance yardstick (see opinfo_harness.py).

The default suite runs every entry whose ATen op nntile registers (its samples must
all run with tiled kernels only, untiled and with dim 0 in two tiles) and a few
entries that exercise the shared mechanisms (views, out= resizing, wrapped numbers,
untiled tasks, the host fallback). ``-m slow`` runs every other float32 entry of the
database.
"""

from __future__ import annotations

import pytest
from opinfo_harness import XFAIL, claims_native, entry_id, float32_entries, run_entry

ENTRIES = {entry_id(op): op for op in float32_entries()}

MECHANISMS = [
    # composite ops that reach native ATen ops through views and reshapes
    "nn.functional.linear", "matmul", "t", "permute", "reshape", "squeeze", "unsqueeze", "broadcast_to", "expand",
    "diagonal_scatter", "select_scatter", "slice_scatter", "sum_to_size", "addr", "nn.functional.mse_loss",
    "nn.functional.cross_entropy", "nn.functional.layer_norm", "nn.functional.softmin",
    # untiled tasks: out= resizing, wrapped numbers, convolution hooks, mutated arguments
    "cumsum", "copysign", "nn.functional.conv2d", "index_select", "linalg.vector_norm", "nn.functional.gelu",
    "cat", "tril", "topk", "nn.functional.max_pool2d",
    # the host fallback: no Meta kernel, a result's shape from values
    "logcumsumexp", "cummax",
]
FAST = sorted({n for n, op in ENTRIES.items() if claims_native(op)} | {n for n in MECHANISMS if n in ENTRIES})


def _check(name: str) -> None:
    if name in XFAIL:
        pytest.xfail(XFAIL[name])
    op = ENTRIES[name]
    out = run_entry(op)
    assert out.failure is None, out.failure
    if claims_native(op):
        assert out.fallback == 0, f"{out.fallback} samples ran on the host fallback: {out.fallback_ops}"
        assert out.untiled == 0, f"{out.untiled} samples ran untiled tasks: {sorted(out.untiled_ops)}"
    assert out.native + out.untiled + out.fallback + out.skipped > 0


@pytest.mark.parametrize("name", FAST)
def test_opinfo(name: str) -> None:
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(ENTRIES) - set(FAST)))
def test_opinfo_all(name: str) -> None:
    _check(name)


def test_fast_subset_names_exist() -> None:
    assert set(MECHANISMS) <= set(ENTRIES), set(MECHANISMS) - set(ENTRIES)


def test_no_native_kernel_hides_a_composite() -> None:
    """A PrivateUse1 kernel for a CompositeImplicitAutograd op would take the place of
    its decomposition below autograd: its outputs would get no gradient."""
    import torch

    from torch_nntile.backend.aten import REGISTERED

    hidden = [r for r in REGISTERED
              if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{r}", "CompositeImplicitAutograd")]
    assert not hidden
