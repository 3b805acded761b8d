"""Our own ops (``torch.ops.torch_nntile.*``) for ``torch_nntile.nn.functional``: the
forward and backward steps that no single ATen op records as one graph op. Each has a
CPU kernel in plain torch (what CPU tensors and the fallback run) and a recording form
that records one graph op."""

from __future__ import annotations

import math
from typing import Any

import torch

from torch_nntile.backend.aten import check_live, define, ew, promote
from torch_nntile.backend.device import new_tensor, read, read_opt
from torch_nntile.kernels import native
from torch_nntile.ops import linalg, loss, norm, reduce, vector_norm
from torch_nntile.ops.views import reshape

_NONE, _MEAN = loss.NONE, loss.MEAN


def _out(node: Any) -> torch.Tensor | None:
    return new_tensor(node) if node is not None else None


# -- linear's weight gradient: ``g^T @ x`` over the rows of any leading shape -----------------


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def _linear_weight_grad_cpu(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.mm(_rows(grad).t(), _rows(x))


def _linear_weight_grad(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One product reading the rows of ``grad`` transposed (no copy of ``grad.T``)."""
    check_live()
    g, xn = read(grad), read(x)
    if g.shape[:-1] != xn.shape[:-1]:
        raise RuntimeError(f"linear_weight_grad: grad of shape {list(g.shape)} and input of shape {list(xn.shape)} "
                           "differ in their leading dims")
    rows = math.prod(xn.shape[:-1])
    g2 = reshape(g, (rows, g.shape[-1])) if len(g.shape) != 2 else g
    x2 = reshape(xn, (rows, xn.shape[-1])) if len(xn.shape) != 2 else xn
    return new_tensor(linalg.mm(g2, True, x2, False, promote(grad, x)))


linear_weight_grad = define("linear_weight_grad(Tensor grad, Tensor x) -> Tensor", _linear_weight_grad_cpu,
                            _linear_weight_grad)


# -- silu's gradient: an elementwise kernel (ATen's silu_backward is a composite) ---------------


def silu_backward_out(g: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> None:
    """As CPU's ``silu_backward``: ``g * s * (1 + x * (1 - s))``, ``s = sigmoid(x)``."""
    s = torch.sigmoid(x)
    torch.mul(g * s, 1 + x * (1 - s), out=out)


def _silu_backward_rule(p: native.Program, args: list[Any], kw: dict[str, Any]) -> native.Ref:
    if kw or len(args) != 2:
        raise native.Unsupported
    g, x = args
    s = p.emit(native.SIGMOID, x)
    return p.emit(native.MUL, p.emit(native.MUL, g, s), p.emit(native.ADD, 1.0, p.emit(native.MUL, x, p.emit(
        native.SUB, 1.0, s))))


native.RULES[silu_backward_out] = _silu_backward_rule


def _silu_backward_cpu(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.silu_backward(grad, x)


def _silu_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    check_live()
    if grad.shape != x.shape:
        raise RuntimeError(f"silu_backward: grad of shape {list(grad.shape)} does not match the input's "
                           f"{list(x.shape)}")
    return new_tensor(ew("silu_backward", silu_backward_out, [grad, x], torch.promote_types(grad.dtype, x.dtype)))


silu_backward = define("silu_backward(Tensor grad, Tensor x) -> Tensor", _silu_backward_cpu, _silu_backward)


# -- RMS norm -------------------------------------------------------------------------------


def _check_rms_dtype(x: torch.Tensor) -> None:
    if not x.dtype.is_floating_point:
        raise NotImplementedError(f"\"rms_norm\" not implemented for '{reduce.type_word(x.dtype)}'")


def _rms_norm_cpu(x: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor | None,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The tile kernel over the whole value (as PyTorch's composite ``rms_norm``, float32
    statistics for half types), keeping rstd."""
    shape = tuple(normalized_shape)
    norm.check_shapes(norm.RMS, x, shape, (weight,))
    _check_rms_dtype(x)
    y = torch.empty_like(x)
    rstd = torch.empty(x.shape[:x.dim() - len(shape)] + (1,) * len(shape), dtype=x.dtype)
    norm.rms_norm_tile(shape, eps, weight is not None, False, y, rstd, x, *(() if weight is None else (weight,)))
    return y, rstd


def _rms_norm(x: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor | None,
              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    check_live()
    _check_rms_dtype(x)
    y, rstd = norm.rms_norm(read(x), tuple(normalized_shape), read_opt(weight), eps)
    return new_tensor(y), new_tensor(rstd)


def _rms_norm_backward_cpu(grad: torch.Tensor, x: torch.Tensor, normalized_shape: list[int], rstd: torch.Tensor,
                           weight: torch.Tensor | None, output_mask: list[bool]
                           ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    shape = tuple(normalized_shape)
    w = (weight,) if weight is not None else ()
    gx = norm.rms_norm_grad(0, shape, weight is not None, grad, x, rstd, w).to(x.dtype) if output_mask[0] else None
    gw = norm.rms_norm_grad(1, shape, False, grad, x, rstd, ()).to(weight.dtype) \
        if output_mask[1] and weight is not None else None
    return gx, gw


def _rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, normalized_shape: list[int], rstd: torch.Tensor,
                       weight: torch.Tensor | None, output_mask: list[bool]
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    check_live()
    gx, gw = norm.rms_norm_backward(read(grad), read(x), tuple(normalized_shape), read(rstd), read_opt(weight),
                                    (bool(output_mask[0]), bool(output_mask[1])))
    return _out(gx), _out(gw)


rms_norm = define("rms_norm(Tensor x, int[] normalized_shape, Tensor? weight, float eps) -> (Tensor, Tensor)",
                  _rms_norm_cpu, _rms_norm)
rms_norm_backward = define("rms_norm_backward(Tensor grad, Tensor x, int[] normalized_shape, Tensor rstd, "
                           "Tensor? weight, bool[2] output_mask) -> (Tensor?, Tensor?)",
                           _rms_norm_backward_cpu, _rms_norm_backward)


# -- cross-entropy over the last dim ------------------------------------------------------------


def _cross_entropy_cpu(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int,
                       reduction: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tile kernel over all rows: the loss (per row for none), the rows' logsumexp and
    the number of labels not ignored."""
    loss.check_cross_entropy(logits, labels)
    acc = reduce.acc_dtype(logits.dtype)
    value = torch.empty(labels.shape if reduction == _NONE else (), dtype=logits.dtype)
    lse, count = torch.empty(labels.shape, dtype=acc), torch.empty((), dtype=acc)
    loss.ce_rows_tile(reduction, ignore_index, True, lse, value, count, logits, labels)
    return value, lse, count


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int,
                   reduction: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_live()
    outs = loss.cross_entropy(read(logits), read(labels), reduction, ignore_index)
    return tuple(new_tensor(n) for n in outs)  # type: ignore[return-value]


def _cross_entropy_backward_cpu(grad: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor,
                                count: torch.Tensor, ignore_index: int, reduction: int) -> torch.Tensor:
    out = torch.empty_like(logits)
    loss.ce_grad_tile(reduction, ignore_index, 0, out, grad, logits, labels, lse, count)
    return out


def _cross_entropy_backward(grad: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor,
                            count: torch.Tensor, ignore_index: int, reduction: int) -> torch.Tensor:
    check_live()
    return new_tensor(loss.cross_entropy_backward(read(grad), read(logits), read(labels), read(lse), read(count),
                                                  reduction, ignore_index))


cross_entropy = define("cross_entropy(Tensor logits, Tensor labels, int ignore_index, int reduction) "
                       "-> (Tensor, Tensor, Tensor)", _cross_entropy_cpu, _cross_entropy)
cross_entropy_backward = define("cross_entropy_backward(Tensor grad, Tensor logits, Tensor labels, Tensor lse, "
                                "Tensor count, int ignore_index, int reduction) -> Tensor",
                                _cross_entropy_backward_cpu, _cross_entropy_backward)


# -- the gradient of a vector norm ---------------------------------------------------------------


def _vector_norm_backward_cpu(grad: torch.Tensor, x: torch.Tensor, norm_: torch.Tensor, ord: float, dim: list[int],
                              keepdim: bool) -> torch.Tensor:
    dims = reduce.norm_dims(tuple(dim), x.dim())
    g, n = vector_norm.keep_reduced(dims, keepdim, grad), vector_norm.keep_reduced(dims, keepdim, norm_)
    count = vector_norm.vnorm_at_norm(dims, True, x, n) if math.isinf(ord) else None
    return vector_norm.vnorm_grad(ord, g, x, n, count).to(x.dtype)


def _vector_norm_backward(grad: torch.Tensor, x: torch.Tensor, norm_: torch.Tensor, ord: float, dim: list[int],
                          keepdim: bool) -> torch.Tensor:
    check_live()
    return new_tensor(vector_norm.vector_norm_backward(read(grad), read(x), read(norm_), ord, tuple(dim), keepdim))


vector_norm_backward = define("vector_norm_backward(Tensor grad, Tensor x, Tensor norm, float ord, int[] dim, "
                              "bool keepdim) -> Tensor", _vector_norm_backward_cpu, _vector_norm_backward)
