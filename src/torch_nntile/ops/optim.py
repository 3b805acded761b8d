"""Fused optimizer updates (SGD, AdamW): one graph op per parameter per step, one task per
tile updating the parameter and its state, which share the parameter's axis groups.

The update math is written once, out of place (``*_update``), in ``torch.optim``'s
order; tile kernels and the ``torch_nntile::`` CPU kernels both call it, and float32
tiles run it in C (``csrc/nn.c``). See docs/architecture/kernels.md.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel, native
from torch_nntile.ops.base import Op, broadcast_axes, input_index, kernel_name, record
from torch_nntile.tiling.tiles import Arg, Lowering, R, W

Tile = torch.Tensor


def sgd_update(lr: float, momentum: float, dampening: float, weight_decay: float, nesterov: bool, maximize: bool,
               first: bool, p_out: Tile, buf_out: Tile | None, p: Tile, g: Tile, buf: Tile | None) -> None:
    """``torch.optim.SGD``'s update; ``first``: the momentum buffer starts as the gradient
    (``buf`` is not read)."""
    g = g.neg() if maximize else g
    if weight_decay != 0:
        g = g.add(p, alpha=weight_decay)
    if momentum != 0:
        if first:
            buf_out.copy_(g)
        else:
            torch.mul(buf, momentum, out=buf_out).add_(g, alpha=1 - dampening)
        g = g.add(buf_out, alpha=momentum) if nesterov else buf_out
    torch.add(p, g, alpha=-lr, out=p_out)


def adamw_update(lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, maximize: bool,
                 step_size: float, bias_correction2_sqrt: float, p_out: Tile, m_out: Tile, v_out: Tile,
                 vmax_out: Tile | None, p: Tile, g: Tile, m: Tile, v: Tile, vmax: Tile | None) -> None:
    """``torch.optim.AdamW``'s update (decoupled weight decay; AMSGrad when ``vmax`` is
    given), with the host's bias corrections: ``step_size = lr / (1 - beta1**step)``."""
    in_place = p_out is p
    if p.is_complex():  # as torch.optim: real and imaginary parts are separate entries
        p_out, m_out, v_out, p, g, m, v = (torch.view_as_real(t) for t in (p_out, m_out, v_out, p, g, m, v))
        if vmax is not None:
            vmax_out, vmax = torch.view_as_real(vmax_out), torch.view_as_real(vmax)
    g = g.neg() if maximize else g
    if weight_decay != 0:
        torch.mul(p, 1 - lr * weight_decay, out=p_out)
    elif not in_place:
        p_out.copy_(p)
    torch.lerp(m, g, 1 - beta1, out=m_out)
    torch.mul(v, beta2, out=v_out).addcmul_(g, g, value=1 - beta2)
    if vmax is not None:
        torch.maximum(vmax, v_out, out=vmax_out)
        v_out = vmax_out
    denom = (v_out.sqrt() / bias_correction2_sqrt).add_(eps)
    p_out.addcdiv_(m_out, denom, value=-step_size)


# -- tile kernels: the task's tiles are the outputs, then the inputs --------------------


def sgd_tile(lr: float, momentum: float, dampening: float, weight_decay: float, nesterov: bool, maximize: bool,
             first: bool, *tiles: Tile) -> None:
    if momentum == 0:
        p_out, p, g = tiles
        sgd_update(lr, momentum, dampening, weight_decay, nesterov, maximize, first, p_out, None, p, g, None)
        return
    p_out, buf_out, p, g, *buf = tiles
    sgd_update(lr, momentum, dampening, weight_decay, nesterov, maximize, first, p_out, buf_out, p, g,
               buf[0] if buf else None)


def bias_corrections(lr: float, beta1: float, beta2: float, step: float) -> tuple[float, float]:
    """``step_size`` and ``bias_correction2_sqrt`` of step ``step``, in double (as the C
    kernel works them out from a step count tile)."""
    return lr / (1 - beta1**step), (1 - beta2**step) ** 0.5


def adamw_tile(lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, amsgrad: bool,
               maximize: bool, step_size: float | None, bias_correction2_sqrt: float, *tiles: Tile) -> None:
    """``step_size`` None: the bias corrections come from the step count, the last tile."""
    n = 4 if amsgrad else 3
    if step_size is None:
        step_size, bias_correction2_sqrt = bias_corrections(lr, beta1, beta2, tiles[-1].item())
        tiles = tiles[:-1]
    outs, ins = list(tiles[:n]), list(tiles[n:])
    if not amsgrad:
        outs.append(None)
        ins.append(None)
    adamw_update(lr, beta1, beta2, eps, weight_decay, maximize, step_size, bias_correction2_sqrt, *outs, *ins)


def _same_shapes(shapes: tuple[tuple[int, ...], ...]) -> bool:
    return all(s == shapes[0] for s in shapes)


def _sgd_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]) -> tuple[list[int], tuple] | None:
    lr, momentum, dampening, weight_decay, nesterov, maximize, first = params
    if not _same_shapes(shapes):
        return None
    mom = momentum != 0
    return ([native.SGD, native.numel(shapes[0]), int(mom), int(mom and not first), int(nesterov), int(maximize),
             int(weight_decay != 0)], (-lr, momentum, 1 - dampening, weight_decay))


def _adamw_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]) -> tuple[list[int], tuple] | None:
    """The scalars as ``adamw_update`` works them out (in double, rounded to float in C)."""
    lr, beta1, beta2, eps, weight_decay, amsgrad, maximize, step_size, bias_correction2_sqrt = params
    from_step = step_size is None
    if not _same_shapes(shapes[:-1] if from_step else shapes) or (from_step and shapes[-1] != ()):
        return None
    scalars = (beta1, lr) if from_step else (bias_correction2_sqrt, -step_size)
    return ([native.ADAMW, native.numel(shapes[0]), int(amsgrad), int(maximize), int(weight_decay != 0),
             int(from_step)], (1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2, scalars[0], eps, scalars[1]))


native.ROWS[sgd_tile] = _sgd_rows
native.ROWS[adamw_tile] = _adamw_rows


# -- the graph op --------------------------------------------------------------------


def _lower_update(ctx: Lowering, node: OpNode) -> None:
    kernel, name = node.attrs
    ins = [ctx.input(n) for n in node.inputs]  # one tiling for all: their groups are merged
    outs = [ctx.output(n) for n in node.outputs]
    nd = len(outs[0].shape)
    for idx in outs[0].indices():
        ctx.task(kernel, [Arg(o, idx, W) for o in outs] + [Arg(a, input_index(a, idx, nd), R) for a in ins], name)


UPDATE = Op("update", _lower_update, kernel_name, binds_kernel=True)
"""An optimizer's update of one parameter: ``attrs = (kernel, name)``; the kernel takes
the output tiles, then the input tiles, of one tile index (a 0-dim input, a step
count, is the same tile for every index)."""


def update(name: str, kernel: Kernel, inputs: list[DataNode], n_out: int) -> tuple[DataNode, ...]:
    """Record ``kernel`` over ``inputs`` (the parameter first; all of its shape and dtype
    but a 0-dim step count last), giving ``n_out`` new values of the first input's shape,
    dtype and axis groups."""
    shape, axes = broadcast_axes(inputs)
    return record(UPDATE, tuple(inputs), (kernel, name), [(shape, inputs[0].dtype, axes)] * n_out)


def sgd_step(p: DataNode, g: DataNode, buf: DataNode | None, lr: float, momentum: float, dampening: float,
             weight_decay: float, nesterov: bool, maximize: bool, first: bool) -> tuple[DataNode, ...]:
    """New parameter (and momentum buffer, when ``momentum``); ``buf`` is read unless ``first``."""
    kernel = Kernel(sgd_tile, lr, momentum, dampening, weight_decay, nesterov, maximize, first)
    ins = [p, g] + ([buf] if momentum != 0 and not first else [])
    return update("sgd_step", kernel, ins, 2 if momentum != 0 else 1)


def adamw_step(p: DataNode, g: DataNode, m: DataNode, v: DataNode, vmax: DataNode | None, lr: float, beta1: float,
               beta2: float, eps: float, weight_decay: float, maximize: bool, step_size: float,
               bias_correction2_sqrt: float, step: DataNode | None = None) -> tuple[DataNode, ...]:
    """New parameter, ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq`` with AMSGrad).
    With ``step`` (a 0-dim count) the kernel works the bias corrections out from it, so
    the recorded op is the same every step (``capture`` replays it)."""
    amsgrad = vmax is not None
    kernel = Kernel(adamw_tile, lr, beta1, beta2, eps, weight_decay, amsgrad, maximize,
                    None if step is not None else step_size, 0.0 if step is not None else bias_correction2_sqrt)
    ins = [p, g, m, v] + ([vmax] if amsgrad else [])
    n_out = len(ins) - 1
    return update("adamw_step", kernel, ins + ([step] if step is not None else []), n_out)
