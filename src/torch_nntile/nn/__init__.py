"""Layers, functions and models for nntile users (they run on CPU too).

``functional``: autograd functions, each recording one tiled graph op forward and one
backward; ``module``: ``nn.Module`` layers over them; ``model``: ``DeepReLU``, ``GPT2``,
``Llama``; ``weight_layout``: HF <-> our attention weight layout.
"""

from torch_nntile.nn import functional, model, module, weight_layout  # noqa: F401
from torch_nntile.nn.model import GPT2, DeepReLU, Llama  # noqa: F401
from torch_nntile.nn.module import GELU, SDPA, Embedding, LayerNorm, Linear, ReLU, RMSNorm, SiLU  # noqa: F401

__all__ = ["functional", "model", "module", "weight_layout", "DeepReLU", "GPT2", "Llama", "GELU", "SDPA", "Embedding",
           "LayerNorm", "Linear", "ReLU", "RMSNorm", "SiLU"]
