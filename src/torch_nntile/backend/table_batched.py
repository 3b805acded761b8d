"""ATen ops with no nntile kernel that run one tile at a time along the dims they map
over (ops/batched.py).

A row says which arguments carry the split dims (the first one named decides: with
``rank``, only when it has that many dims, i.e. the batched form of the op), which dims
of it are split (the batch, dim 0, by default; the batch and the channels for pooling,
padding and upsampling; every dim but the sorted one for sorting and selecting), which
results are sums over them (weight gradients), which integer arguments give their
extents, which argument names a dim that results without ``keepdim`` lack, and further
axes carried by other arguments (a convolution's output channels: its weight's dim 0).
The rest of the results carry the split dims too. Anything else about the call is checked
by ``untiled.record`` (every argument and result that carries the split dims must have
their extents); a call that does not fit runs untiled, as one task.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch_nntile.ops.base import wrap_dim


@dataclass(frozen=True)
class Axis:
    """A further split axis, carried by other arguments than the row's first ones:
    ``args``, the dim of each argument that carries it; ``results``, the dim of each
    result that does (the others are sums over it); ``when``, a condition on the call."""
    args: dict[str, int]
    results: dict[int, int]
    when: Callable[[dict[str, Any]], bool] | None = None


@dataclass(frozen=True)
class Split:
    args: tuple[str, ...]  # arguments whose dim 0 is the batch; the first present one decides
    rank: int | None = None  # the first must have this many dims
    sums: tuple[int, ...] = ()  # results that are sums over the batch
    sizes: tuple[str, ...] = ()  # int arguments equal to the batch size, or int lists led by it
    when: Callable[[dict[str, Any]], bool] | None = None  # a further condition on the arguments by name
    dims: Callable[[dict[str, Any]], tuple[int, ...]] | None = None  # the first's split dims (default: dim 0)
    reduced: str | None = None  # the argument naming a dim results lack where not kept (keepdim=False)
    more: tuple[Axis, ...] = ()  # further split axes


def _batched_conv(a: dict[str, Any]) -> bool:
    return a["input"].dim() == a["weight"].dim()


def _other_dims(a: dict[str, Any]) -> bool:
    return a["self"].dim() >= 2


def _all_but_dim(a: dict[str, Any]) -> tuple[int, ...]:
    """Sorting and selecting along ``dim``: split along every other dim."""
    x = a["self"]
    d = wrap_dim(a["dim"], x.dim())
    return tuple(k for k in range(x.dim()) if k != d)


def _planes(a: dict[str, Any]) -> tuple[int, ...]:
    """Pooling, padding and upsampling of a batch of channels: every plane on its own."""
    return (0, 1)


def _eval(flag: str) -> Callable[[dict[str, Any]], bool]:
    return lambda a: not a[flag]


def _plain_conv(a: dict[str, Any]) -> bool:
    """Output channels split the weight's dim 0 (not a transposed convolution's) and need
    every input channel (one group)."""
    return not a["transposed"] and a["groups"] == 1


_POOL_BACKWARD = ("grad_output", "self", "indices")
# a convolution's output channels: its weight's and bias's dim 0, the output's dim 1; in the
# backward the input's gradient sums over them
_COUT = Axis({"weight": 0, "bias": 0}, {0: 1}, when=_plain_conv)
_COUT_BACKWARD = Axis({"grad_output": 1, "weight": 0}, {1: 0, 2: 0}, when=_plain_conv)
SPLITS: dict[str, Split] = {
    "aten::convolution_overrideable": Split(("input",), when=_batched_conv, more=(_COUT,)),
    "aten::convolution_backward_overrideable": Split(("grad_output", "input"), sums=(1, 2), when=_batched_conv,
                                                     more=(_COUT_BACKWARD,)),
    "aten::native_group_norm": Split(("input",), sizes=("N",)),
    "aten::native_group_norm_backward": Split(("grad_out", "input", "mean", "rstd"), sums=(1, 2), sizes=("N",)),
    # batch norm with the running statistics (eval mode): per sample; its saved statistics are empty
    "aten::native_batch_norm": Split(("input",), sums=(1, 2), when=_eval("training")),
    "aten::_native_batch_norm_legit": Split(("input",), sums=(1, 2), when=_eval("training")),
    "aten::_native_batch_norm_legit_no_training": Split(("input",), sums=(1, 2)),
    "aten::native_batch_norm_backward": Split(("grad_out", "input"), sums=(1, 2), when=_eval("train")),
    "aten::im2col": Split(("self",), rank=4),
    "aten::col2im": Split(("self",), rank=3),
    "aten::pixel_shuffle": Split(("self",), rank=4),
    "aten::pixel_unshuffle": Split(("self",), rank=4),
    "aten::grid_sampler_2d": Split(("input", "grid")),
    "aten::grid_sampler_2d_backward": Split(("grad_output", "input", "grid")),
    "aten::topk": Split(("self",), when=_other_dims, dims=_all_but_dim),
    "aten::sort": Split(("self",), when=_other_dims, dims=_all_but_dim),
    "aten::kthvalue": Split(("self",), when=_other_dims, dims=_all_but_dim, reduced="dim"),
    "aten::median": Split(("self",), when=lambda a: "dim" in a and _other_dims(a), dims=_all_but_dim, reduced="dim"),
    "aten::mode": Split(("self",), when=_other_dims, dims=_all_but_dim, reduced="dim"),
}
for _d, _rank in ((1, 3), (2, 4), (3, 5)):
    for _pool in ("max_pool{}d_with_indices", "adaptive_max_pool{}d"):
        SPLITS[f"aten::{_pool.format(_d)}"] = Split(("self",), rank=_rank, dims=_planes)
        SPLITS[f"aten::{_pool.format(_d)}_backward"] = Split(_POOL_BACKWARD, rank=_rank, dims=_planes)
    for _pool in ("avg_pool{}d", "_adaptive_avg_pool{}d", "reflection_pad{}d", "replication_pad{}d"):
        SPLITS[f"aten::{_pool.format(_d)}"] = Split(("self",), rank=_rank, dims=_planes)
        SPLITS[f"aten::{_pool.format(_d)}_backward"] = Split(("grad_output", "self"), rank=_rank, dims=_planes)
for _up in ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
            "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
            "upsample_bicubic2d", "upsample_trilinear3d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"):
    SPLITS[f"aten::{_up}"] = Split(("self", "input"), dims=_planes)
    SPLITS[f"aten::{_up}_backward"] = Split(("grad_output",), sizes=("input_size",), dims=_planes)


def split_of(name: str, named: dict[str, Any]) -> Split | None:
    """The row for a call of ``name`` (without its overload) with the arguments
    ``named`` (``ops.base.by_name``), if it applies."""
    row = SPLITS.get(name)
    if row is None:
        return None
    lead = next((named[n] for n in row.args if n in named), None)
    if lead is None or not lead.dim() or (row.rank is not None and lead.dim() != row.rank):
        return None
    if row.when is not None and not row.when(named):
        return None
    return row
