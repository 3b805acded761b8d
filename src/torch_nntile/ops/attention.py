"""Scaled dot-product attention (``sdpa``) and rotary embedding (``rope``) in the projection
layout ``[batch, seq, head_size, heads]``, forward and backward as one graph op each.

``sdpa`` runs ATen's CPU flash-attention kernel per (batch tile, head tile); the plain
functions at the top are both the eager CPU kernels and the tile kernels' bodies. See
docs/architecture/adding-an-op.md (lowering patterns: attention).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from torch_nntile.graph.axes import new_group, union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel, native
from torch_nntile.ops.base import Op, record
from torch_nntile.tiling.tiles import Arg, Lowering, R, Tiling, W

_aten = torch.ops.aten
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# -- checks (shared by the CPU kernels and the recording forms) -----------------------


LAYOUTS = ("bsdh", "bshd", "bhsd")  # the order of (batch, seq, head_size, heads) dims


def bsdh(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """A 4-D shape in ``layout`` reordered to ``[batch, seq, head_size, heads]``."""
    return tuple(shape[layout.index(c)] for c in "bsdh")


def check_sdpa(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], dtypes: tuple[torch.dtype, ...],
               layout: str = "bsdh") -> int:
    """Validate q, k, v shapes (``[batch, seq, head_size, heads]`` in ``layout``'s
    order); return the number of q heads per kv head."""
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        raise ValueError(f"sdpa: q, k and v must be 4-D [batch, seq, head_size, heads], got shapes {list(q)}, "
                         f"{list(k)} and {list(v)}")
    if layout not in LAYOUTS:
        raise ValueError(f"sdpa: layout must be one of {LAYOUTS}, got {layout!r}")
    q, k, v = bsdh(q, layout), bsdh(k, layout), bsdh(v, layout)
    if k != v:
        raise ValueError(f"sdpa: k and v must have the same shape, got {list(k)} and {list(v)}")
    if q[0] != k[0] or q[2] != k[2]:
        raise ValueError(f"sdpa: q {list(q)} and k {list(k)} differ in batch or head_size")
    if (k[3] == 0 and q[3] != 0) or (k[3] and q[3] % k[3]):
        raise ValueError(f"sdpa: {q[3]} query heads are not a multiple of {k[3]} key/value heads")
    if len(set(dtypes)) != 1 or dtypes[0] not in _FLOATS:
        raise TypeError(f"sdpa: q, k and v must share one floating dtype, got {[str(d) for d in dtypes]}")
    return q[3] // k[3] if k[3] else 1


def lse_dtype(dt: torch.dtype) -> torch.dtype:
    """The dtype of the flash kernel's logsumexp: float32 below float64."""
    return torch.float64 if dt == torch.float64 else torch.float32


def rope_dtype(x: torch.dtype, cos: torch.dtype, sin: torch.dtype) -> torch.dtype:
    """The dtype of rope's result: the three operands' promoted."""
    return torch.promote_types(torch.promote_types(x, cos), sin)


def check_rope(x: tuple[int, ...], cos: tuple[int, ...], sin: tuple[int, ...]) -> None:
    if len(x) != 4:
        raise ValueError(f"rope: x must be 4-D [batch, seq, head_size, heads], got shape {list(x)}")
    if x[2] % 2:
        raise ValueError(f"rope: head_size must be even, got {x[2]}")
    if cos != sin:
        raise ValueError(f"rope: cos and sin must have the same shape, got {list(cos)} and {list(sin)}")
    if tuple(cos) != (x[1], x[2]) and not (len(cos) == 3 and cos[0] in (1, x[0]) and tuple(cos[1:]) == (x[1], x[2])):
        raise ValueError(f"rope: cos and sin must be [seq, head_size] or [batch, seq, head_size] for x of shape "
                         f"{list(x)}, got {list(cos)}")


# -- plain computations (whole tensors or tiles) --------------------------------------


def _heads_first(t: torch.Tensor, layout: str, rep: int = 1) -> torch.Tensor:
    """A tensor in ``layout`` -> ``[b, h * rep, s, d]`` with head_size dense (each head
    repeated ``rep`` times in place, as HF's ``repeat_kv``): what the flash kernel
    reads (any other strides)."""
    t = t.permute(*(layout.index(c) for c in "bhsd"))
    if rep > 1:
        return t.repeat_interleave(rep, dim=1)
    return t if t.stride(3) == 1 else t.contiguous()


def from_heads_first(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A ``[b, h, s, d]`` tensor seen in ``layout`` (a view)."""
    return t.permute(*("bhsd".index(c) for c in layout))


def _empty(q: torch.Tensor, k: torch.Tensor) -> bool:
    return q.numel() == 0 or k.numel() == 0  # the flash kernel divides by such extents


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rep: int, is_causal: bool,
           scale: float | None, layout: str = "bsdh") -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output ``[b, h, sq, d]`` and logsumexp ``[b, h, sq]`` (the flash
    kernel's layouts) of tensors in ``layout``."""
    qh, kh, vh = _heads_first(q, layout), _heads_first(k, layout, rep), _heads_first(v, layout, rep)
    if _empty(qh, kh):  # no key (zero output) or nothing to compute
        return qh.new_zeros(qh.shape), qh.new_full(qh.shape[:3], -math.inf, dtype=lse_dtype(q.dtype))
    return _aten._scaled_dot_product_flash_attention_for_cpu(qh, kh, vh, 0.0, is_causal, scale=scale)


def attend_backward(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, rep: int, is_causal: bool, scale: float | None, layout: str = "bsdh"
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq ``[b, h, sq, d]``, dk and dv ``[b, kv, sk, d]`` (summed over each group's q
    heads) of tensors in ``layout``; ``lse`` is ``[b, sq, h]``."""
    qh, kh, vh = _heads_first(q, layout), _heads_first(k, layout, rep), _heads_first(v, layout, rep)
    if _empty(qh, kh):  # nothing attends: zero gradients
        return qh.new_zeros(qh.shape), _heads_first(k.new_zeros(k.shape), layout), _heads_first(v.new_zeros(v.shape), layout)
    dq, dk, dv = _aten._scaled_dot_product_flash_attention_for_cpu_backward(
        _heads_first(g, layout), qh, kh, vh, _heads_first(out, layout), lse.permute(0, 2, 1), 0.0, is_causal,
        scale=scale)
    if rep > 1:
        b, h, s, d = dk.shape
        dk, dv = dk.view(b, h // rep, rep, s, d).sum(2), dv.view(b, h // rep, rep, s, d).sum(2)
    return dq, dk, dv


def sdpa_tile(rep: int, is_causal: bool, scale: float | None, layout: str, o: torch.Tensor, lse: torch.Tensor,
              q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    out, logsumexp = attend(q, k, v, rep, is_causal, scale, layout)
    o.copy_(from_heads_first(out, layout))
    lse.copy_(logsumexp.permute(0, 2, 1))


def sdpa_backward_tile(rep: int, is_causal: bool, scale: float | None, layout: str, dq: torch.Tensor,
                       dk: torch.Tensor, dv: torch.Tensor, g: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    for o, t in zip((dq, dk, dv), attend_backward(g, q, k, v, out, lse, rep, is_causal, scale, layout)):
        o.copy_(from_heads_first(t, layout))


def rope_tile(transpose: bool, y: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """``y = x*cos + rotate_half(x)*sin`` over a ``[b, s, d, h]`` tile (cos and sin
    ``[s, d]`` or ``[b or 1, s, d]``, broadcast over heads); with ``transpose`` its
    exact transpose ``y = x*cos - rotate_half(x*sin)``, the gradient."""
    half = x.shape[2] // 2
    x1, x2, y1, y2 = x[:, :, :half], x[:, :, half:], y[:, :, :half], y[:, :, half:]
    c, s = cos.unsqueeze(-1), sin.unsqueeze(-1)
    c1, c2, s1, s2 = c[..., :half, :], c[..., half:, :], s[..., :half, :], s[..., half:, :]
    torch.mul(x1, c1, out=y1)
    torch.mul(x2, c2, out=y2)
    if transpose:  # [x1 c1 + x2 s2, x2 c2 - x1 s1]
        y1.addcmul_(x2, s2)
        y2.addcmul_(x1, s1, value=-1)
    else:  # [x1 c1 - x2 s1, x2 c2 + x1 s2]
        y1.addcmul_(x2, s1, value=-1)
        y2.addcmul_(x1, s2)


def _rope_rows(params: tuple[bool], shapes: tuple[tuple[int, ...], ...]) -> tuple[list[int], tuple] | None:
    """Float32 tiles run in C (``csrc/nn.c``); cos and sin shared by the batch items or one per item."""
    (transpose,) = params
    y, x, c, s = shapes
    if y != x or c != s or len(x) != 4 or x[2] % 2 or tuple(c[-2:]) != x[1:3] or len(c) not in (2, 3):
        return None
    per_batch = len(c) == 3 and c[0] != 1
    if per_batch and c[0] != x[0]:
        return None
    return [native.ROPE, *x, int(per_batch), int(transpose)], ()


native.ROWS[rope_tile] = _rope_rows


# -- sdpa graph ops -----------------------------------------------------------------


def _aligned(heads: tuple[int, ...], rep: int) -> tuple[int, ...]:
    """The head tiling of q nearest to ``heads`` whose tiles hold whole groups of ``rep``
    heads: tiles are merged up to the next boundary that is a multiple of ``rep``."""
    out, cur, acc = [], 0, 0
    for t in heads:
        cur += t
        acc += t
        if acc % rep == 0:
            out.append(cur)
            cur = 0
    return tuple(out)


def _placed(layout: str, **by_dim: Any) -> tuple:
    """The values given per dim letter (``b``, ``s``, ``d``, ``h``) in ``layout``'s order."""
    return tuple(by_dim[c] for c in layout)


def _tilings(ctx: Lowering, q: DataNode, k: DataNode, rep: int, layout: str) -> tuple[Tiling, Tiling, Tiling]:
    """q's, kv's and logsumexp's tilings for the tasks: q's batch and (aligned) head
    tiles, everything else whole."""
    planned = ctx.tiling(q)
    batch, heads = planned[layout.index("b")], _aligned(planned[layout.index("h")], rep)
    kv_heads = tuple(h // rep for h in heads)
    _, sq, d, _ = bsdh(q.shape, layout)
    sk = bsdh(k.shape, layout)[1]
    return (_placed(layout, b=batch, s=(sq,), d=(d,), h=heads), _placed(layout, b=batch, s=(sk,), d=(d,), h=kv_heads),
            (batch, (sq,), heads))


def _tile_indices(layout: str, n_batch: int, n_heads: int) -> list[tuple[tuple[int, ...], tuple[int, int, int]]]:
    """Each task's tile index in ``layout`` and in the logsumexp ``[b, s, h]``."""
    return [(_placed(layout, b=i, s=0, d=0, h=j), (i, 0, j)) for i in range(n_batch) for j in range(n_heads)]


def _lower_sdpa(ctx: Lowering, node: OpNode) -> None:
    rep, is_causal, scale, layout = node.attrs
    qn, kn, vn = node.inputs
    qt, kvt, lt = _tilings(ctx, qn, kn, rep, layout)
    q, k, v = ctx.input(qn, qt), ctx.input(kn, kvt), ctx.input(vn, kvt)
    o, lse = ctx.output(node.outputs[0], qt), ctx.output(node.outputs[1], lt)
    kernel = Kernel(sdpa_tile, rep, is_causal, scale, layout)
    for t4, t3 in _tile_indices(layout, len(lt[0]), len(lt[2])):
        ctx.task(kernel, [Arg(o, t4, W), Arg(lse, t3, W), Arg(q, t4, R), Arg(k, t4, R), Arg(v, t4, R)], "sdpa_fwd")


def _lower_sdpa_backward(ctx: Lowering, node: OpNode) -> None:
    rep, is_causal, scale, layout = node.attrs
    gn, qn, kn, vn, on, ln = node.inputs
    qt, kvt, lt = _tilings(ctx, qn, kn, rep, layout)
    g, q, out = (ctx.input(n, qt) for n in (gn, qn, on))
    k, v, lse = ctx.input(kn, kvt), ctx.input(vn, kvt), ctx.input(ln, lt)
    dq = ctx.output(node.outputs[0], qt)
    dk, dv = ctx.output(node.outputs[1], kvt), ctx.output(node.outputs[2], kvt)
    kernel = Kernel(sdpa_backward_tile, rep, is_causal, scale, layout)
    for t4, t3 in _tile_indices(layout, len(lt[0]), len(lt[2])):
        ctx.task(kernel, [Arg(dq, t4, W), Arg(dk, t4, W), Arg(dv, t4, W), Arg(g, t4, R), Arg(q, t4, R),
                          Arg(k, t4, R), Arg(v, t4, R), Arg(out, t4, R), Arg(lse, t3, R)], "sdpa_bwd")


def _products(node: OpNode, q: DataNode, k: DataNode) -> float:
    """Multiply-adds of the two matrix products of attention."""
    layout = node.attrs[3]
    b, sq, d, h = bsdh(q.shape, layout)
    return 2.0 * b * h * sq * bsdh(k.shape, layout)[1] * d


SDPA = Op("sdpa_fwd", _lower_sdpa, cost=lambda node: _products(node, *node.inputs[:2]))
SDPA_BACKWARD = Op("sdpa_bwd", _lower_sdpa_backward, cost=lambda node: 2.5 * _products(node, *node.inputs[1:3]))


def sdpa(q: DataNode, k: DataNode, v: DataNode, is_causal: bool, scale: float | None,
         layout: str = "bsdh") -> tuple[DataNode, DataNode]:
    """Record attention: output in q's layout and groups, logsumexp ``[b, sq, h]``."""
    rep = check_sdpa(q.shape, k.shape, v.shape, (q.dtype, k.dtype, v.dtype), layout)
    ib, idd, ih = layout.index("b"), layout.index("d"), layout.index("h")
    for a, b in zip(k.axes, v.axes):
        union(a, b)
    union(q.axes[ib], k.axes[ib])
    union(q.axes[idd], k.axes[idd])
    if rep == 1:  # heads tiled alike: no re-tiling of k and v (grouped heads are re-tiled to q's groups)
        union(q.axes[ih], k.axes[ih])
    b, sq, _, h = bsdh(q.shape, layout)
    lse_axes = (q.axes[ib], new_group(sq), q.axes[ih])  # its seq dim is only ever whole
    return record(SDPA, (q, k, v), (rep, is_causal, scale, layout),
                  [(q.shape, q.dtype, q.axes), ((b, sq, h), lse_dtype(q.dtype), lse_axes)])


def sdpa_backward(g: DataNode, q: DataNode, k: DataNode, v: DataNode, out: DataNode, lse: DataNode, is_causal: bool,
                  scale: float | None, layout: str = "bsdh") -> tuple[DataNode, DataNode, DataNode]:
    """Record the gradients of q, k and v, in their layouts and groups."""
    rep = check_sdpa(q.shape, k.shape, v.shape, (q.dtype, k.dtype, v.dtype), layout)
    b, sq, _, h = bsdh(q.shape, layout)
    if g.shape != q.shape or out.shape != q.shape or lse.shape != (b, sq, h):
        raise ValueError(f"sdpa backward: grad {list(g.shape)}, out {list(out.shape)} or logsumexp "
                         f"{list(lse.shape)} do not fit q {list(q.shape)}")
    for a, b_, c in zip(g.axes, q.axes, out.axes):
        union(a, b_)
        union(a, c)
    return record(SDPA_BACKWARD, (g, q, k, v, out, lse), (rep, is_causal, scale, layout),
                  [(q.shape, q.dtype, q.axes), (k.shape, k.dtype, k.axes), (v.shape, v.dtype, v.axes)])


# -- rope graph ops -----------------------------------------------------------------


def _lower_rope(ctx: Lowering, node: OpNode) -> None:
    (transpose,) = node.attrs
    xn, cn, sn = node.inputs
    x = ctx.input(xn, ctx.whole(xn, (2,)))
    y = ctx.output(node.outputs[0], x.tiling)
    bt, st, dt, _ = x.tiling
    three = len(cn.shape) == 3
    per_batch = three and cn.shape[0] == xn.shape[0] and xn.shape[0] != 1
    ct = ((bt if per_batch else (cn.shape[0],)), st, dt) if three else (st, dt)
    cos, sin = ctx.input(cn, ct), ctx.input(sn, ct)
    kernel, name = Kernel(rope_tile, transpose), "rope_bwd" if transpose else "rope_fwd"
    for idx in y.indices():
        cidx = ((idx[0] if per_batch else 0), idx[1], 0) if three else (idx[1], 0)
        ctx.task(kernel, [Arg(y, idx, W), Arg(x, idx, R), Arg(cos, cidx, R), Arg(sin, cidx, R)], name)


ROPE = Op("rope", _lower_rope, lambda node: "rope_bwd" if node.attrs[0] else "rope_fwd",
          cost=lambda node: 2 * node.inputs[0].numel)


def rope(x: DataNode, cos: DataNode, sin: DataNode, transpose: bool) -> DataNode:
    """Record the rotary embedding of ``x`` (``transpose``: its gradient, ``x`` the
    output's gradient); cos and sin share x's seq, head_size (and batch) groups."""
    check_rope(x.shape, cos.shape, sin.shape)
    for a, b in zip(cos.axes, sin.axes):
        union(a, b)
    lead = x.axes[:3] if len(cos.shape) == 3 and cos.shape[0] == x.shape[0] else x.axes[1:3]  # not a broadcast batch
    for a, b in zip(reversed(cos.axes), reversed(lead)):
        union(a, b)
    dtype = rope_dtype(x.dtype, cos.dtype, sin.dtype)
    return record(ROPE, (x, cos, sin), (transpose,), [(x.shape, dtype, x.axes)])[0]
