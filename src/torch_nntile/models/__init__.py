"""``torch_nntile.nn.model`` under the published torch_nntile's other name: the same
classes, and each family's module reachable here too (``torch_nntile.models.llama``
is ``torch_nntile.nn.model.llama``)."""

import importlib
import sys

from torch_nntile.nn import model as _model
from torch_nntile.nn.model import *  # noqa: F401, F403
from torch_nntile.nn.model import __all__  # noqa: F401

for _name in _model.FAMILIES:
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"{_model.__name__}.{_name}")
