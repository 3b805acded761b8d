"""Alias of ``torch_nntile.nn.model`` (the name NNTile users know)."""

from torch_nntile.nn.model import *  # noqa: F401, F403
from torch_nntile.nn.model import __all__  # noqa: F401
