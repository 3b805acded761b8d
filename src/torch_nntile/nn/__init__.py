"""Layers, functions and models for nntile users (they run on CPU too).

``functional``: autograd functions, each recording one tiled graph op forward and one
backward; ``module``: ``nn.Module`` layers over them; ``model``: ``DeepReLU``, ``GPT2``,
``Llama``; ``weight_layout``: HF <-> our attention weight layout; ``linear``: the
published torch_nntile's projection layers and their weight converters.
"""

from torch_nntile.nn import functional, linear, model, module, weight_layout  # noqa: F401
from torch_nntile.nn.attention import sdpa_eager  # noqa: F401
from torch_nntile.nn.model import GPT2, DeepReLU, Llama  # noqa: F401
from torch_nntile.nn.module import GELU, SDPA, Embedding, LayerNorm, Linear, ReLU, RMSNorm, SiLU  # noqa: F401
from torch_nntile.nn.weight_layout import (  # noqa: F401
    convert_attn_weights,
    nntile_to_torch_o_weight,
    nntile_to_torch_qkv_weight,
    torch_to_nntile_o_weight,
    torch_to_nntile_qkv_weight,
)

__all__ = ["functional", "linear", "model", "module", "weight_layout", "DeepReLU", "GPT2", "Llama", "GELU", "SDPA",
           "Embedding", "LayerNorm", "Linear", "ReLU", "RMSNorm", "SiLU", "convert_attn_weights",
           "nntile_to_torch_o_weight", "nntile_to_torch_qkv_weight", "sdpa_eager", "torch_to_nntile_o_weight",
           "torch_to_nntile_qkv_weight"]
