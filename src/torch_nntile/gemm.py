"""N-dimensional GEMM with the published torch_nntile's contraction rules.

Not ``torch.matmul``'s last-two-dims rule: ``a`` ``[batch..., M..., K...]`` times ``b``
``[batch..., K..., N...]`` gives ``[batch..., M..., N...]``, ``ndim`` naming how many
axes the K block has, so projections to and from ``[batch, seq, head_size, n_heads]``
need no reshapes by hand. It is one ``bmm`` (``mm`` without batch axes) of free views,
so its forward and backward record what ``torch.matmul`` would.
"""

from __future__ import annotations

import math

import torch


def _blocks(shape: torch.Size, batch_ndim: int, ndim: int, k_last: bool) -> tuple[list[int], list[int]]:
    """The non-batch, non-contracted axes of an operand and its contracted ones."""
    rest = list(shape[batch_ndim:])
    if len(rest) < ndim:
        raise ValueError(f"gemm: ndim={ndim} and batch_ndim={batch_ndim} do not fit an operand of shape "
                         f"{list(shape)}")
    cut = len(rest) - ndim if k_last else ndim
    return (rest[:cut], rest[cut:]) if k_last else (rest[cut:], rest[:cut])


def gemm(a: torch.Tensor, b: torch.Tensor, *, ndim: int, batch_ndim: int = 0, trans_a: bool = False,
         trans_b: bool = False) -> torch.Tensor:
    """``op(a) @ op(b)`` contracting ``ndim`` axes, the leading ``batch_ndim`` axes shared.

    Args:
        a: ``[batch..., M..., K...]``; with ``trans_a``, ``[batch..., K..., M...]``.
        b: ``[batch..., K..., N...]``; with ``trans_b``, ``[batch..., N..., K...]`` (a
            ``Linear`` weight ``[out, in]`` is ``trans_b=True, ndim=1``).
        ndim: how many axes K has (at least 1).
        batch_ndim: how many leading axes both operands and the result share.

    Returns:
        ``[batch..., M..., N...]``.

    Raises:
        ValueError: the axes do not fit, or the K or batch axes differ.
    """
    if ndim < 1 or batch_ndim < 0:
        raise ValueError(f"gemm: ndim must be positive and batch_ndim not negative, got {ndim} and {batch_ndim}")
    if a.shape[:batch_ndim] != b.shape[:batch_ndim] or min(a.dim(), b.dim()) < batch_ndim:
        raise ValueError(f"gemm: the batch axes of shapes {list(a.shape)} and {list(b.shape)} differ")
    m, k = _blocks(a.shape, batch_ndim, ndim, k_last=not trans_a)
    n, kb = _blocks(b.shape, batch_ndim, ndim, k_last=trans_b)
    if k != kb:
        raise ValueError(f"gemm: contracted axes {k} of a and {kb} of b differ")
    batch = list(a.shape[:batch_ndim])
    nb, nm, nk, nn_ = math.prod(batch), math.prod(m), math.prod(k), math.prod(n)
    lead = [nb] if batch_ndim else []
    a2 = a.reshape(*lead, nk, nm).transpose(-1, -2) if trans_a else a.reshape(*lead, nm, nk)
    b2 = b.reshape(*lead, nn_, nk).transpose(-1, -2) if trans_b else b.reshape(*lead, nk, nn_)
    return (torch.bmm(a2, b2) if batch_ndim else torch.mm(a2, b2)).reshape(*batch, *m, *n)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.matmul``, named here as in the published torch_nntile."""
    return torch.matmul(a, b)


__all__ = ["gemm", "matmul"]
