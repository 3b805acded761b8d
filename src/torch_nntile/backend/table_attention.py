"""torch_nntile:: ops of attention: ``sdpa_fwd`` / ``sdpa_bwd`` and ``rope_fwd`` / ``rope_bwd``.

Each call records one graph op (``ops/attention.py``); the CPU kernels compute the
same values eagerly with the same plain functions.
"""

from __future__ import annotations

import torch

from torch_nntile.backend.aten import check_live, define
from torch_nntile.backend.device import new_tensor, read
from torch_nntile.ops import attention


def _bshd(t: torch.Tensor) -> torch.Tensor:
    """A ``[b, h, s, d]`` result in the projection layout ``[b, s, d, h]``."""
    return t.permute(0, 2, 3, 1).contiguous()


def _sdpa_fwd_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                  scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    rep = attention.check_sdpa(tuple(q.shape), tuple(k.shape), tuple(v.shape), (q.dtype, k.dtype, v.dtype))
    out, lse = attention.attend(q, k, v, rep, is_causal, scale)
    return _bshd(out), lse.permute(0, 2, 1).contiguous()


def _sdpa_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
              scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    check_live()
    out, lse = attention.sdpa(read(q), read(k), read(v), is_causal, scale)
    return new_tensor(out), new_tensor(lse)


def _sdpa_bwd_cpu(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, is_causal: bool, scale: float | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rep = attention.check_sdpa(tuple(q.shape), tuple(k.shape), tuple(v.shape), (q.dtype, k.dtype, v.dtype))
    grads = attention.attend_backward(g, q, k, v, out, lse, rep, is_causal, scale)
    return tuple(_bshd(t) for t in grads)  # type: ignore[return-value]


def _sdpa_bwd(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
              lse: torch.Tensor, is_causal: bool, scale: float | None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_live()
    nodes = attention.sdpa_backward(*(read(t) for t in (g, q, k, v, out, lse)), is_causal, scale)
    return tuple(new_tensor(n) for n in nodes)  # type: ignore[return-value]


def _rope_cpu(transpose: bool):  # noqa: ANN202 - one CPU kernel per direction
    def cpu(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attention.check_rope(tuple(x.shape), tuple(cos.shape), tuple(sin.shape))
        y = torch.empty(x.shape, dtype=attention.rope_dtype(x.dtype, cos.dtype, sin.dtype))
        attention.rope_tile(transpose, y, x, cos, sin)
        return y
    return cpu


def _rope(transpose: bool):  # noqa: ANN202
    def nntile(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        check_live()
        return new_tensor(attention.rope(read(x), read(cos), read(sin), transpose))
    return nntile


SDPA_FWD = define("sdpa_fwd(Tensor q, Tensor k, Tensor v, bool is_causal, float? scale) -> (Tensor, Tensor)",
                  _sdpa_fwd_cpu, _sdpa_fwd)
SDPA_BWD = define("sdpa_bwd(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool is_causal, "
                  "float? scale) -> (Tensor, Tensor, Tensor)", _sdpa_bwd_cpu, _sdpa_bwd)
ROPE_FWD = define("rope_fwd(Tensor x, Tensor cos, Tensor sin) -> Tensor", _rope_cpu(False), _rope(False))
ROPE_BWD = define("rope_bwd(Tensor grad, Tensor cos, Tensor sin) -> Tensor", _rope_cpu(True), _rope(True))
