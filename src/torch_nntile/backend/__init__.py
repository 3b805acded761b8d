"""PyTorch integration: the nntile device, the ATen table and the CPU fallback."""

# Registers the device, then the ATen table (machinery in aten.py, entries in table_*.py;
# the foreach ops last, over the per-tensor ops registered before them).
from torch_nntile.backend import (  # noqa: F401, I001
    aten,
    aten_calls,
    device,
    fallback,
    serialization,
    sparse,
    table_data,
    table_elementwise,
    table_index,
    table_foreach,  # noqa: F401, I001
    table_linalg,
    table_norms,
    table_nn,  # our own ops (torch_nntile::), for torch_nntile.nn and training
    table_attention,
    table_optim,
)
