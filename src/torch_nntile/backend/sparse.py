"""Sparse tensors on nntile: PyTorch's own sparse layouts over nntile components.

A sparse COO or compressed (CSR/CSC/BSR/BSC) tensor on nntile is PyTorch's sparse
tensor whose indices and values are ordinary nntile tensors. Making one, reading its
parts and replacing them only touch metadata, so those ops run PyTorch's Meta
kernels. Every other op on a sparse nntile tensor runs on the CPU fallback, with the
sparse arguments rebuilt on the CPU from their parts (``fallback.py``).
"""

from __future__ import annotations

from typing import Any

import torch

_COO_META = torch._C.DispatchKeySet(torch._C.DispatchKey.SparseMeta)
_CSR_META = torch._C.DispatchKeySet(torch._C.DispatchKey.SparseCsrMeta)
_META_OPS = {
    "SparsePrivateUse1": (_COO_META, (
        "_sparse_coo_tensor_with_dims_and_tensors", "_indices", "_values", "indices", "values", "_nnz",
        "is_coalesced", "sparse_dim", "dense_dim", "_coalesced_", "sparse_resize_", "sparse_resize_and_clear_")),
    "SparseCsrPrivateUse1": (_CSR_META, (
        "values", "crow_indices", "col_indices", "ccol_indices", "row_indices", "_nnz", "sparse_dim", "dense_dim")),
}
_COMPRESSED = {  # layout -> accessors of its (compressed, plain) indices
    torch.sparse_csr: ("crow_indices", "col_indices"), torch.sparse_bsr: ("crow_indices", "col_indices"),
    torch.sparse_csc: ("ccol_indices", "row_indices"), torch.sparse_bsc: ("ccol_indices", "row_indices"),
}
_aten = torch.ops.aten
_LIB = torch.library.Library("aten", "IMPL")


def _meta_kernel(op: Any, keys: torch._C.DispatchKeySet) -> Any:
    return lambda *a, **k: op.redispatch(keys, *a, **k)


for _key, (_keys, _names) in _META_OPS.items():
    for _name in _names:
        _LIB.impl(_name, _meta_kernel(getattr(_aten, _name).default, _keys), _key)


def route_to(kernel_for: Any) -> None:
    """Register ``kernel_for(op)`` for every ATen op PyTorch's CPU implements for a
    sparse layout: on nntile's sparse keys such ops would otherwise take a dense
    composite kernel (which fails on sparse tensors) before any fallback."""
    for key, cpu_key in (("SparsePrivateUse1", "SparseCPU"), ("SparseCsrPrivateUse1", "SparseCsrCPU")):
        meta = set(_META_OPS[key][1])
        for name in torch._C._dispatch_get_all_op_names():
            if not name.startswith("aten::") or not torch._C._dispatch_has_kernel_for_dispatch_key(name, cpu_key):
                continue
            base, _, ov = name.removeprefix("aten::").partition(".")
            if base in meta:
                continue
            op = getattr(getattr(_aten, base), ov or "default")
            _LIB.impl(name.removeprefix("aten::"), kernel_for(op), key)


def sparse_to_cpu(t: torch.Tensor) -> torch.Tensor:
    """The CPU sparse tensor with the same parts (each moved through the dense path)."""
    if t.layout == torch.sparse_coo:
        return torch.sparse_coo_tensor(t._indices().cpu(), t._values().cpu(), t.shape, is_coalesced=t.is_coalesced(),
                                       check_invariants=False)  # the parts of a valid tensor
    compressed, plain = _COMPRESSED[t.layout]
    return torch.sparse_compressed_tensor(getattr(t, compressed)().cpu(), getattr(t, plain)().cpu(),
                                          t.values().cpu(), t.shape, layout=t.layout, check_invariants=False)


def write_sparse(t: torch.Tensor, cpu: torch.Tensor) -> None:
    """Make sparse nntile tensor ``t`` hold CPU sparse tensor ``cpu`` (an op changed
    it in place): its parts are replaced by nntile copies of ``cpu``'s."""
    src = cpu.to(t.device)
    if t.layout == torch.sparse_coo:
        _aten.copy_sparse_to_sparse_.default.redispatch(_COO_META, t, src)
    else:
        _aten.resize_as_sparse_.default.redispatch(_CSR_META, t, src)
        _aten.copy_.default.redispatch(_CSR_META, t, src)
