"""Convert attention weights between HuggingFace's head layout and ours.

Ours puts the head index last (output feature ``d * n_heads + h``), so projections
reshape for free to ``[batch, seq, head_size, n_heads]``; the converters also undo
GPT-2's transposed, fused q/k/v ``Conv1D`` weights. They take any tensors and need no
``transformers``. See docs/architecture/index.md (the public layers).
"""

from __future__ import annotations

import torch

StateDict = dict[str, torch.Tensor]


def heads_to_ours(w: torch.Tensor, n_heads: int, dim: int = 0) -> torch.Tensor:
    """Reorder ``dim`` (of size ``n_heads * head_size``) from HF's order to ours."""
    return _swap(w, n_heads, dim, to_ours=True)


def heads_to_hf(w: torch.Tensor, n_heads: int, dim: int = 0) -> torch.Tensor:
    """The inverse of ``heads_to_ours``."""
    return _swap(w, n_heads, dim, to_ours=False)


def _swap(w: torch.Tensor, n_heads: int, dim: int, to_ours: bool) -> torch.Tensor:
    dim = dim % w.dim()
    n = w.shape[dim]
    if n_heads <= 0 or n % n_heads:
        raise ValueError(f"dim {dim} of size {n} does not split into {n_heads} heads")
    head_size = n // n_heads
    split = (n_heads, head_size) if to_ours else (head_size, n_heads)
    shape = (*w.shape[:dim], *split, *w.shape[dim + 1:])
    return w.reshape(shape).transpose(dim, dim + 1).reshape(w.shape).contiguous()


def gpt2_from_hf(sd: StateDict, n_head: int) -> StateDict:
    """A ``GPT2LMHeadModel`` state dict (or one of its ``transformer``) as our ``GPT2``'s."""
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    out: StateDict = {"wte.weight": sd["wte.weight"], "wpe.weight": sd["wpe.weight"],
                      "ln_f.weight": sd["ln_f.weight"], "ln_f.bias": sd["ln_f.bias"]}
    n_layer = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("h."))
    for i in range(n_layer):
        src, dst = f"h.{i}.", f"blocks.{i}."
        for ln in ("ln_1", "ln_2"):
            out[dst + f"{ln}.weight"], out[dst + f"{ln}.bias"] = sd[src + f"{ln}.weight"], sd[src + f"{ln}.bias"]
        w, b = sd[src + "attn.c_attn.weight"], sd[src + "attn.c_attn.bias"]  # [in, 3 * out]
        for part, (wp, bp) in zip("qkv", zip(w.t().chunk(3, 0), b.chunk(3, 0))):
            out[dst + f"attn.{part}.weight"] = heads_to_ours(wp, n_head, 0)
            out[dst + f"attn.{part}.bias"] = heads_to_ours(bp, n_head, 0)
        out[dst + "attn.o.weight"] = heads_to_ours(sd[src + "attn.c_proj.weight"].t(), n_head, 1)
        out[dst + "attn.o.bias"] = sd[src + "attn.c_proj.bias"]
        for ours, theirs in (("fc", "c_fc"), ("proj", "c_proj")):
            out[dst + f"mlp.{ours}.weight"] = sd[src + f"mlp.{theirs}.weight"].t().contiguous()
            out[dst + f"mlp.{ours}.bias"] = sd[src + f"mlp.{theirs}.bias"]
    return out


def gpt2_to_hf(sd: StateDict, n_head: int) -> StateDict:
    """Our ``GPT2``'s state dict as a ``GPT2LMHeadModel``'s (``lm_head`` tied to ``wte``)."""
    out: StateDict = {"transformer.wte.weight": sd["wte.weight"], "transformer.wpe.weight": sd["wpe.weight"],
                      "transformer.ln_f.weight": sd["ln_f.weight"], "transformer.ln_f.bias": sd["ln_f.bias"]}
    n_layer = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    for i in range(n_layer):
        src, dst = f"blocks.{i}.", f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            out[dst + f"{ln}.weight"], out[dst + f"{ln}.bias"] = sd[src + f"{ln}.weight"], sd[src + f"{ln}.bias"]
        ws = [heads_to_hf(sd[src + f"attn.{p}.weight"], n_head, 0) for p in "qkv"]
        bs = [heads_to_hf(sd[src + f"attn.{p}.bias"], n_head, 0) for p in "qkv"]
        out[dst + "attn.c_attn.weight"] = torch.cat(ws, 0).t().contiguous()
        out[dst + "attn.c_attn.bias"] = torch.cat(bs, 0)
        out[dst + "attn.c_proj.weight"] = heads_to_hf(sd[src + "attn.o.weight"], n_head, 1).t().contiguous()
        out[dst + "attn.c_proj.bias"] = sd[src + "attn.o.bias"]
        for ours, theirs in (("fc", "c_fc"), ("proj", "c_proj")):
            out[dst + f"mlp.{theirs}.weight"] = sd[src + f"mlp.{ours}.weight"].t().contiguous()
            out[dst + f"mlp.{theirs}.bias"] = sd[src + f"mlp.{ours}.bias"]
    out["lm_head.weight"] = sd["wte.weight"]
    return out


_LLAMA_PROJ = {"q": ("self_attn.q_proj", "heads"), "k": ("self_attn.k_proj", "kv"), "v": ("self_attn.v_proj", "kv"),
               "o": ("self_attn.o_proj", "out"), "gate": ("mlp.gate_proj", None), "up": ("mlp.up_proj", None),
               "down": ("mlp.down_proj", None)}
_LLAMA_NORM = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}


def _llama_module(ours: str) -> str:
    return ours if ours in _LLAMA_NORM else ("attn." if ours in "qkvo" else "mlp.") + ours


def _llama_convert(sd: StateDict, n_heads: int, n_kv_heads: int, to_ours: bool) -> StateDict:
    swap = heads_to_ours if to_ours else heads_to_hf
    top = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
           "lm_head.weight": "lm_head.weight"}
    out: StateDict = {}
    for ours, theirs in top.items():
        src, dst = (theirs, ours) if to_ours else (ours, theirs)
        if src in sd:
            out[dst] = sd[src]
    layer_key = "model.layers." if to_ours else "layers."
    n_layer = 1 + max(int(k[len(layer_key):].split(".")[0]) for k in sd if k.startswith(layer_key))
    for i in range(n_layer):
        pairs = [(f"layers.{i}.{_llama_module(o)}", f"model.layers.{i}.{t}", kind)
                 for o, (t, kind) in _LLAMA_PROJ.items()]
        pairs += [(f"layers.{i}.{o}", f"model.layers.{i}.{t}", None) for o, t in _LLAMA_NORM.items()]
        for ours, theirs, kind in pairs:
            for leaf in ("weight", "bias"):
                src, dst = (f"{theirs}.{leaf}", f"{ours}.{leaf}") if to_ours else (f"{ours}.{leaf}", f"{theirs}.{leaf}")
                if src not in sd:
                    continue
                t = sd[src]
                if kind in ("heads", "kv"):
                    t = swap(t, n_heads if kind == "heads" else n_kv_heads, 0)
                elif kind == "out" and leaf == "weight":
                    t = swap(t, n_heads, 1)
                out[dst] = t
    return out


def llama_from_hf(sd: StateDict, n_heads: int, n_kv_heads: int | None = None) -> StateDict:
    """A ``LlamaForCausalLM`` state dict as our ``Llama``'s."""
    return _llama_convert(sd, n_heads, n_kv_heads or n_heads, to_ours=True)


def llama_to_hf(sd: StateDict, n_heads: int, n_kv_heads: int | None = None) -> StateDict:
    """Our ``Llama``'s state dict as a ``LlamaForCausalLM``'s."""
    return _llama_convert(sd, n_heads, n_kv_heads or n_heads, to_ours=False)


# -- the published torch_nntile's attention weights: 3-D, head axes split -------------------
# q/k/v ``[hidden, n_heads, head_size]`` (torch) <-> ``[hidden, head_size, n_heads]``
# (nntile: the projection's output is then ``[batch, seq, head_size, n_heads]``);
# o ``[n_heads, head_size, hidden]`` <-> ``[head_size, n_heads, hidden]``. Each is its
# own inverse's transpose, so round trips are exact.


def _swap_3d(w: torch.Tensor, dims: tuple[int, int], what: str) -> torch.Tensor:
    if w.dim() != 3:
        raise ValueError(f"{what} must be 3D, got shape {list(w.shape)}")
    return w.transpose(*dims).contiguous()


def torch_to_nntile_qkv_weight(w: torch.Tensor) -> torch.Tensor:
    """``[hidden, n_heads, head_size]`` -> ``[hidden, head_size, n_heads]``."""
    return _swap_3d(w, (1, 2), "qkv weight (hidden, n_heads, head_size)")


def nntile_to_torch_qkv_weight(w: torch.Tensor) -> torch.Tensor:
    """``[hidden, head_size, n_heads]`` -> ``[hidden, n_heads, head_size]``."""
    return _swap_3d(w, (1, 2), "qkv weight (hidden, head_size, n_heads)")


def torch_to_nntile_o_weight(w: torch.Tensor) -> torch.Tensor:
    """``[n_heads, head_size, hidden]`` -> ``[head_size, n_heads, hidden]``."""
    return _swap_3d(w, (0, 1), "o weight (n_heads, head_size, hidden)")


def nntile_to_torch_o_weight(w: torch.Tensor) -> torch.Tensor:
    """``[head_size, n_heads, hidden]`` -> ``[n_heads, head_size, hidden]``."""
    return _swap_3d(w, (0, 1), "o weight (head_size, n_heads, hidden)")


_ATTN_CONVERTERS = {"torch_to_nntile": (torch_to_nntile_qkv_weight, torch_to_nntile_o_weight),
                    "nntile_to_torch": (nntile_to_torch_qkv_weight, nntile_to_torch_o_weight)}


def convert_attn_weights(weights: StateDict, direction: str, *, prefix: str = "") -> StateDict:
    """A copy of ``weights`` whose keys ending in ``q_weight``, ``k_weight``, ``v_weight``
    (or ``o_weight``) are converted in ``direction`` (``"torch_to_nntile"`` or
    ``"nntile_to_torch"``); biases and other keys are kept. With ``prefix``, only keys
    under it."""
    if direction not in _ATTN_CONVERTERS:
        raise ValueError(f"direction must be 'torch_to_nntile' or 'nntile_to_torch', got {direction!r}")
    qkv, o = _ATTN_CONVERTERS[direction]
    under = prefix if not prefix or prefix.endswith(".") else prefix + "."
    out = dict(weights)
    for key, t in weights.items():
        leaf = key.rsplit(".", 1)[-1]
        if key.startswith(under) and leaf in ("q_weight", "k_weight", "v_weight", "o_weight"):
            out[key] = o(t) if leaf == "o_weight" else qkv(t)
    return out
