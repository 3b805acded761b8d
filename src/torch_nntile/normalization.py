"""``rms_norm`` where the published torch_nntile has it (``torch_nntile.normalization``).

The same function as ``torch_nntile.nn.functional.rms_norm`` (one op forward, one
backward on nntile; CPU tensors run on CPU), under the reference's argument names.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_nntile.nn import functional as _F


def rms_norm(input: torch.Tensor, normalized_shape: int | Sequence[int], weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    """As ``torch.nn.functional.rms_norm``: ``eps`` None is the input dtype's epsilon."""
    return _F.rms_norm(input, normalized_shape, weight, eps)


def patch_rms_norm() -> None:
    """The published torch_nntile swaps stock ``F.rms_norm`` for its own here; stock
    ``F.rms_norm`` already runs on nntile tensors, so this changes nothing (kept so
    scripts that call it run)."""


__all__ = ["patch_rms_norm", "rms_norm"]
