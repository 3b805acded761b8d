// View kernels of the nntile device, registered for PrivateUse1 with no Python in the call.
//
// A view on nntile is metadata only: a new TensorImpl over the same storage (whose
// Python object carries the value's payload), with new sizes, strides and offset; the
// graph learns of it when an op reads the view. ATen's generic implementations do
// exactly that for any device and raise CPU's errors (a size that does not fit, a
// geometry past the storage, whose size nntile storages report as CPU's would). Run
// from Python they cost 7-14 us a call; a transformer step makes about 170 (split,
// transpose, permute, expand and view all end in these). Loaded by backend/table_data.py;
// where this library was not built, the same kernels run as Python there.
//
// Also the placement of a storage at a fake address (backend/device.py), which torch 2.13
// does from Python (`UntypedStorage._swap_data_ptr_`) and torch 2.11 cannot: in place, so
// that every tensor on a storage that grows sees its new size and address.
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/StorageImpl.h>
#include <torch/library.h>

namespace {

// Give the storage of `self` `nbytes` bytes at `address`, which no one reads: nothing to
// free, and not resizable, as a storage over an address made by Python is.
void place_storage(const at::Tensor& self, int64_t address, int64_t nbytes) {
    c10::StorageImpl* st = self.storage().unsafeGetStorageImpl();
    st->set_data_ptr_noswap(c10::DataPtr(reinterpret_cast<void*>(address), self.device()));
    st->set_nbytes(nbytes);
    st->set_resizable(false);
}

}  // namespace

TORCH_LIBRARY(torch_nntile_native, m) {
    m.def("place_storage(Tensor self, int address, int nbytes) -> ()", &place_storage);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
    m.impl("view", TORCH_FN(at::native::view));
    m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
    m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
}
