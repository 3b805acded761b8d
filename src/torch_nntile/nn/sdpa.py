"""``torch_nntile.nn.attention`` and the ``SDPA`` layer under the published
torch_nntile's module name (``torch_nntile.nn.sdpa``)."""

from torch_nntile.nn.attention import attention, nntile_model_transpose, sdpa, sdpa_eager, sdpa_kernel
from torch_nntile.nn.model.common import make_causal_sdpa_mask
from torch_nntile.nn.module import SDPA

__all__ = ["SDPA", "attention", "make_causal_sdpa_mask", "nntile_model_transpose", "sdpa", "sdpa_eager", "sdpa_kernel"]
