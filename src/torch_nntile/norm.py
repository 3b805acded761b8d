"""``vector_norm`` where the published torch_nntile has it (``torch_nntile.norm``): the
same function as ``torch_nntile.nn.functional.vector_norm``."""

from torch_nntile.nn.functional import vector_norm


def patch_vector_norm() -> None:
    """The published torch_nntile swaps stock ``torch.linalg.vector_norm`` for its own
    here; the stock function already runs on nntile tensors, so this changes nothing
    (kept so scripts that call it run)."""


__all__ = ["patch_vector_norm", "vector_norm"]
