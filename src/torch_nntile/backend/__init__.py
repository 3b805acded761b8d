"""PyTorch integration: the nntile device, the ATen table and the CPU fallback."""

from torch_nntile.backend import aten, device, fallback  # noqa: F401  (registers the device and kernels)
