"""What the model-zoo tests share to compare our models with HF's: inputs, HF weights
drawn away from their trivial starting values, tiling the inputs, and the check of
outputs and every parameter's gradient (``rel_err`` of conftest against ``RTOL``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as TF
from conftest import rel_err

import torch_nntile

RTOL = 1e-4  # the bound for our models against HF's
BATCH_SEQ = {0: "batch", 1: "seq"}


def token_ids(vocab: int, batch: int = 3, seq: int = 12) -> torch.Tensor:
    """Seeded token ids ``[batch, seq]`` below ``vocab``."""
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))


def causal_lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy of ``logits`` ``[batch, seq, vocab]`` against ``ids``."""
    return TF.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def spread_norms_and_biases_(model: torch.nn.Module, norm: str, *, bias: tuple[float, float] = (-0.2, 0.2),
                             scale: tuple[float, float] = (0.5, 1.5)) -> torch.nn.Module:
    """``model`` with its biases uniform in ``bias`` and the other parameters whose name
    holds ``norm`` uniform in ``scale``: HF starts them at zeros and ones, where a wrong
    gradient or a missed term would go unseen."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.uniform_(*bias)
            elif norm in name:
                p.uniform_(*scale)
    return model


def tile(tiles: dict | None, *named: tuple[torch.Tensor, dict[int, str]]) -> None:
    """With ``tiles`` (tile sizes per axis group), name the axes of each ``(tensor,
    {axis: group})`` and tile the groups; without, nothing."""
    if not tiles:
        return
    for t, groups in named:
        torch_nntile.set_axis_group_name(t, groups)
    for name, sizes in tiles.items():
        torch_nntile.set_axis_group_tiling(name, sizes)


def grad_errors(reference: torch.nn.Module, grads: dict[str, torch.Tensor]) -> dict[str, float]:
    """``rel_err`` of ``grads[name]`` against the gradient of each of ``reference``'s
    parameters."""
    return {name: rel_err(grads[name], p.grad) for name, p in reference.named_parameters()}


def check_lm_against_hf(hf: torch.nn.Module, ours: torch.nn.Module, ids: torch.Tensor,
                        grads_to_hf: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]], *,
                        tiles: dict | None = None, embedding: torch.nn.Module | None = None,
                        out_grad: torch.Tensor | None = None, rtol: float = RTOL, **kwargs) -> float:
    """Our logits and every gradient (mapped to HF's names) against HF's on the CPU,
    asserted within ``rtol``; returns the largest relative error.

    ``ours`` runs where its parameters are; ``tiles`` tiles ``ids``' axes ``batch`` and
    ``seq`` (and ``embedding``'s output's, for an embedding that gathers by the flattened
    ids). The backward starts from ``out_grad`` on the logits, else from
    ``causal_lm_loss``; ``kwargs`` go to ``ours``.
    """
    def backward(logits: torch.Tensor, ids: torch.Tensor) -> None:
        if out_grad is None:
            causal_lm_loss(logits, ids).backward()
        else:
            logits.backward(out_grad.to(logits.device))

    want = hf(ids).logits
    backward(want, ids)
    ids_d = ids.to(next(ours.parameters()).device)
    tile(tiles, (ids_d, BATCH_SEQ))
    hook = None
    if tiles and embedding is not None:
        hook = embedding.register_forward_hook(lambda mod, args, out: torch_nntile.set_axis_group_name(out, BATCH_SEQ))
    try:
        got = ours(ids_d, **kwargs)
        backward(got, ids_d)
    finally:
        if hook is not None:
            hook.remove()
    errs = {"logits": rel_err(got.cpu(), want)}
    errs.update(grad_errors(hf, grads_to_hf({n: p.grad.cpu() for n, p in ours.named_parameters()})))
    worst = max(errs, key=errs.get)
    assert errs[worst] <= rtol, (worst, errs[worst])
    return errs[worst]
