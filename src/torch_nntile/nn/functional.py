"""Functions for models on nntile (and on CPU, with CPU's numbers): each is an autograd
function whose forward records one graph op and whose backward records one op per
gradient (or one op for all of them, where one ATen op gives them together).

Where one ATen op does the job and nntile records it as one op, it is called directly
(``torch.ops.aten``); the others are our own ops (``torch.ops.torch_nntile``, defined in
``backend/table_nn.py``). Reshapes between them are views (free).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
from torch.autograd.function import Function, FunctionCtx, once_differentiable

from torch_nntile.add_fiber import add_fiber, axpby
from torch_nntile.gemm import gemm, matmul
from torch_nntile.nn.attention import sdpa, sdpa_eager, sdpa_kernel
from torch_nntile.rope import rope, rope_sin_cos_from_position_ids
from torch_nntile.sum_slice import gap, sum_slice

__all__ = ["add", "add_fiber", "apply_nntile_patches", "cross_entropy", "embedding", "gap", "gelu", "gelutanh", "gemm",
           "layer_norm", "linear", "matmul", "mse_loss", "mul", "mul_scalar", "relu", "rms_norm", "rope",
           "rope_sin_cos_from_position_ids", "sdpa", "sdpa_eager", "sdpa_kernel", "silu", "softmax", "sum_slice",
           "vector_norm"]

_aten = torch.ops.aten
_own = torch.ops.torch_nntile
_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _reduction(reduction: str) -> int:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return _REDUCTIONS[reduction]


def _rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` of shape ``[..., n]`` as a matrix ``[rows, n]`` (a view)."""
    return x.reshape(math.prod(x.shape[:-1]), n)


def _c_name(dt: torch.dtype) -> str:
    """A dtype as ATen's messages name it."""
    return {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
            torch.bfloat16: "c10::BFloat16"}.get(dt, str(dt).removeprefix("torch."))


def _param(t: torch.Tensor | None) -> torch.Tensor | None:
    """What a backward keeps of a parameter: its data under a new tensor, so that
    ``Module.to`` (which swaps a parameter only while nothing else holds it, as with a
    move to nntile) still works while a CPU forward's graph is alive, as stock layers do."""
    return None if t is None else t.detach()


def _shape(normalized_shape: int | Sequence[int]) -> list[int]:
    return [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)


# -- linear -----------------------------------------------------------------------------


class _Linear(Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.dim() < 1 or weight.dim() < 1:
            raise RuntimeError(f"both arguments to linear need to be at least 1D, but they are {x.dim()}D and "
                               f"{weight.dim()}D")
        if weight.dim() != 2:
            raise RuntimeError(f"linear: weight must be 2-D [out, in], got {weight.dim()}-D")
        if x.dtype != weight.dtype:
            raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {_c_name(x.dtype)} != "
                               f"{_c_name(weight.dtype)}")
        x2 = _rows(x, x.shape[-1])
        y = _aten.mm(x2, weight.t()) if bias is None else _aten.addmm(bias, x2, weight.t())
        ctx.save_for_backward(x, _param(weight))
        ctx.bias_shape = None if bias is None else bias.shape
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        g2 = _rows(g, weight.shape[0])
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _aten.mm(g2, weight).reshape(x.shape)
        if ctx.needs_input_grad[1]:
            gw = _own.linear_weight_grad(g, x)
        if ctx.needs_input_grad[2]:
            gb = _aten.sum(g2, [0])
            if tuple(ctx.bias_shape) != tuple(gb.shape):  # a bias that broadcast
                gb = gb.sum_to_size(ctx.bias_shape)
        return gx, gw, gb


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x`` of shape ``[..., in]`` and ``weight`` ``[out, in]``:
    one product forward, one per gradient (the bias's a sum)."""
    return _Linear.apply(x, weight, bias)


# -- activations ----------------------------------------------------------------------------


class _Relu(Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        y = _aten.relu(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return _aten.threshold_backward(g, y, 0)


class _Gelu(Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, approximate: str) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return _aten.gelu(x, approximate=approximate)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        return _aten.gelu_backward(g, x, approximate=ctx.approximate), None


class _Silu(Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return _aten.silu(x)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return _own.silu_backward(g, x)


def relu(x: torch.Tensor) -> torch.Tensor:
    """``max(x, 0)`` elementwise, as ``F.relu``: one op forward, one backward (which reads
    the output, so the input need not be kept)."""
    return _Relu.apply(x)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU as ``F.gelu``: exact (erf) by default, ``approximate="tanh"`` the tanh
    approximation (GPT-2's ``gelu_new``, also ``gelutanh``). One op forward, one backward."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _Gelu.apply(x, approximate)


def gelutanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (``F.gelu(x, approximate="tanh")``)."""
    return gelu(x, "tanh")


def add(x: torch.Tensor, y: torch.Tensor, *, alpha: float = 1.0, beta: float = 1.0) -> torch.Tensor:
    """``alpha * x + beta * y`` (a residual connection), as the published torch_nntile's."""
    return axpby(x, y, alpha, beta)


def mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a * b`` elementwise (broadcasting), as the published torch_nntile's."""
    return a * b


def mul_scalar(input: torch.Tensor, scalar: float) -> torch.Tensor:
    """``scalar * input``, as the published torch_nntile's."""
    return input * float(scalar)


def apply_nntile_patches() -> None:
    """The published torch_nntile's switch that swaps stock ``F.rms_norm``,
    ``F.cross_entropy`` and ``torch.linalg.vector_norm`` for its own
    (``normalization.patch_rms_norm``, ``loss.patch_cross_entropy``,
    ``norm.patch_vector_norm``). Here the stock functions already run on nntile tensors,
    recorded into the graph with CPU's numbers, so those change nothing, and nor does
    this (kept so scripts that call it run)."""


def silu(x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(x)``, as ``F.silu`` (Llama's MLP activation): one op forward, one
    backward."""
    return _Silu.apply(x)


# -- normalizations --------------------------------------------------------------------------


class _LayerNorm(Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, shape: list[int], weight: torch.Tensor | None,
                bias: torch.Tensor | None, eps: float) -> torch.Tensor:
        y, mean, rstd = _aten.native_layer_norm(x, shape, weight, bias, eps)
        ctx.save_for_backward(x, _param(weight), _param(bias), mean, rstd)
        ctx.shape = shape
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, bias, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        gx, gw, gb = _aten.native_layer_norm_backward(g, x, ctx.shape, mean, rstd, weight, bias,
                                                      [need[0], need[2], need[3]])
        return gx, None, gw, gb, None


class _RmsNorm(Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, shape: list[int], weight: torch.Tensor | None,
                eps: float) -> torch.Tensor:
        y, rstd = _own.rms_norm(x, shape, weight, eps)
        ctx.save_for_backward(x, _param(weight), rstd)
        ctx.shape = shape
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        gx, gw = _own.rms_norm_backward(g, x, ctx.shape, rstd, weight, [need[0], need[2]])
        return gx, None, gw, None


def layer_norm(x: torch.Tensor, normalized_shape: int | Sequence[int], weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """Layer normalization over the last dimensions, as ``F.layer_norm``: one op forward
    and one backward that gives the gradients of ``x``, ``weight`` and ``bias`` together.

    Args:
        x: the input, of shape ``[..., *normalized_shape]``.
        normalized_shape: the trailing dimensions to normalize over (an int: the last one).
        weight: the scale, of shape ``normalized_shape``; None: no scaling.
        bias: the shift, of shape ``normalized_shape``; None: no shift.
        eps: added to the variance before its square root.

    Returns:
        ``x`` normalized to mean 0 and variance 1 over those dimensions, then scaled and
        shifted, in ``x``'s shape.
    """
    return _LayerNorm.apply(x, _shape(normalized_shape), weight, bias, eps)


def rms_norm(x: torch.Tensor, normalized_shape: int | Sequence[int], weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    """As ``torch.nn.functional.rms_norm``: ``eps`` None is the machine epsilon of ``x``'s
    (float32, for half types) dtype."""
    if eps is None:
        eps = torch.finfo(torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype).eps \
            if x.dtype.is_floating_point else 0.0
    return _RmsNorm.apply(x, _shape(normalized_shape), weight, float(eps))


# -- embedding, softmax -----------------------------------------------------------------------


class _Embedding(Function):
    @staticmethod
    def forward(ctx: FunctionCtx, indices: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(indices)
        ctx.num_weights = weight.shape[0]
        return _aten.embedding(weight, indices)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> tuple[None, torch.Tensor]:
        (indices,) = ctx.saved_tensors
        return None, _aten.embedding_dense_backward(g, indices, ctx.num_weights, -1, False)


class _Softmax(Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, dim: int) -> torch.Tensor:
        y = _aten._softmax(x, dim, False)
        ctx.save_for_backward(y)
        ctx.dim, ctx.dtype = dim, x.dtype
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (y,) = ctx.saved_tensors
        return _aten._softmax_backward_data(g, y, ctx.dim, ctx.dtype), None


def embedding(indices: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The rows of ``weight`` at ``indices`` (any shape): ``F.embedding`` without
    ``padding_idx`` / ``max_norm``."""
    return _Embedding.apply(indices, weight)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax along ``dim`` (the last by default), as ``F.softmax`` without a ``dtype``
    argument: one op forward, one backward (which reads the output)."""
    return _Softmax.apply(x, dim)


# -- losses, norms ------------------------------------------------------------------------------


class _CrossEntropy(Function):
    @staticmethod
    def forward(ctx: FunctionCtx, logits: torch.Tensor, labels: torch.Tensor, ignore_index: int,
                reduction: int) -> torch.Tensor:
        value, lse, count = _own.cross_entropy(logits, labels, ignore_index, reduction)
        ctx.save_for_backward(logits, labels, lse, count)
        ctx.ignore_index, ctx.reduction = ignore_index, reduction
        return value

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        logits, labels, lse, count = ctx.saved_tensors
        return _own.cross_entropy_backward(g, logits, labels, lse, count, ctx.ignore_index, ctx.reduction), \
            None, None, None


class _MseLoss(Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, target: torch.Tensor, reduction: int) -> torch.Tensor:
        ctx.save_for_backward(x, target)
        ctx.reduction = reduction
        return _aten.mse_loss(x, target, reduction)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, target = ctx.saved_tensors
        need = ctx.needs_input_grad
        gx = _aten.mse_loss_backward(g, x, target, ctx.reduction) if need[0] else None
        gt = _aten.mse_loss_backward(g, target, x, ctx.reduction) if need[1] else None  # the same, negated
        return gx, gt, None


class _VectorNorm(Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, ord: float, dim: list[int] | None, keepdim: bool) -> torch.Tensor:
        n = _aten.linalg_vector_norm(x, ord, dim, keepdim)
        ctx.save_for_backward(x, n)
        ctx.args = (float(ord), list(dim) if dim is not None else [], keepdim)
        return n

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        x, n = ctx.saved_tensors
        return _own.vector_norm_backward(g, x, n, *ctx.args), None, None, None


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100,
                  reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of ``[..., C]`` logits (the class dim last) against int64 labels of
    the leading shape ``[...]``, any rank; ``"none"`` gives the loss in the labels' shape.
    One op forward, one backward (which recomputes the softmax from each row's logsumexp)."""
    red = _reduction(reduction)
    if labels.dtype == torch.uint8:  # CPU accepts Byte labels too
        labels = labels.long()
    return _CrossEntropy.apply(logits, labels, ignore_index, red)


def mse_loss(x: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Squared error between ``x`` and ``target``, as ``F.mse_loss``: one op forward, one
    per gradient. Tensors of different shapes broadcast, with ``F.mse_loss``'s warning.

    Args:
        x: the prediction.
        target: what it should be; it gets a gradient too if it requires one.
        reduction: ``"mean"`` or ``"sum"`` of the squared errors (a scalar), or ``"none"``
            for the elementwise errors.

    Raises:
        ValueError: ``reduction`` is none of those.
    """
    red = _reduction(reduction)
    if x.shape != target.shape:  # as F.mse_loss: warn, then broadcast
        warnings.warn(f"Using a target size ({target.shape}) that is different to the input size ({x.shape}). "
                      "This will likely lead to incorrect results due to broadcasting. Please ensure they have the "
                      "same size.", stacklevel=2)
        x, target = torch.broadcast_tensors(x, target)
    return _MseLoss.apply(x, target, red)


def vector_norm(x: torch.Tensor, ord: float = 2, dim: int | Sequence[int] | None = None,
                keepdim: bool = False) -> torch.Tensor:
    """``torch.linalg.vector_norm`` (real inputs)."""
    dims = None if dim is None else [dim] if isinstance(dim, int) else list(dim)
    return _VectorNorm.apply(x, ord, dims, keepdim)
