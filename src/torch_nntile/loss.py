"""The losses where the published torch_nntile has them (``torch_nntile.loss``): the
same functions as ``torch_nntile.training``'s."""

from torch_nntile.training import cross_entropy, mse_loss


def patch_cross_entropy() -> None:
    """The published torch_nntile swaps stock ``F.cross_entropy`` for its own here; stock
    ``F.cross_entropy`` already runs on nntile tensors, so this changes nothing (kept so
    scripts that call it run)."""


__all__ = ["cross_entropy", "mse_loss", "patch_cross_entropy"]
