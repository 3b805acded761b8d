// The nntile device's hooks: what PyTorch asks the current accelerator for CPU work.
//
// Once torch_nntile is imported, nntile is the process's accelerator, and PyTorch asks
// its hooks for things that concern CPU tensors too: `Tensor.pin_memory()`,
// `DataLoader(pin_memory=True)` and `torch.empty(..., pin_memory=True)` want the
// accelerator's pinned-memory allocator. The hooks PyTorch installs for a backend written
// in Python have none, so every pinning in the process raised. These hooks answer it.
//
// Pinned memory is host memory the accelerator reads without staging. nntile's tiles
// live in host memory and its CPU workers read any page, so pinned memory is ordinary
// CPU memory here; the allocator remembers what it handed out so that `is_pinned()` is
// true for it, as users of CUDA expect. (CUDA workers will need page-locked memory.)
//
// PyTorch accepts one hooks object per process: this library registers it when it
// loads, and the package then does not register the Python one (backend/device.py).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/version.h>

#include <mutex>
#include <unordered_set>

namespace {

constexpr c10::DeviceType kNntile = c10::DeviceType::PrivateUse1;

// Blocks of host memory handed out as pinned, so `is_pinned()` can recognize them.
std::mutex pinned_lock;
std::unordered_set<const void*>& pinned() {
    static auto* blocks = new std::unordered_set<const void*>();  // never destroyed: frees may run at exit
    return *blocks;
}

void free_pinned(void* p) {
    {
        std::lock_guard<std::mutex> g(pinned_lock);
        pinned().erase(p);
    }
    c10::free_cpu(p);
}

struct PinnedAllocator final : public c10::Allocator {
    c10::DataPtr allocate(size_t n) override {
        void* p = n ? c10::alloc_cpu(n) : nullptr;
        if (p) {
            std::lock_guard<std::mutex> g(pinned_lock);
            pinned().insert(p);
        }
        return {p, p, &free_pinned, c10::Device(c10::DeviceType::CPU)};
    }
    c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
    void copy_data(void* dest, const void* src, std::size_t count) const override {
        default_copy_data(dest, src, count);
    }
};

PinnedAllocator kPinned;

struct NntileHooks final : public at::PrivateUse1HooksInterface {
    bool isBuilt() const override { return true; }
    bool isAvailable() const override { return true; }
    bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
    c10::DeviceIndex deviceCount() const override { return 1; }
    c10::DeviceIndex getCurrentDevice() const override { return 0; }
    void setCurrentDevice(c10::DeviceIndex) const override {}
    c10::DeviceIndex exchangeDevice(c10::DeviceIndex) const override { return 0; }
    c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override { return 0; }

    c10::Allocator* getPinnedMemoryAllocator() const override { return &kPinned; }
    bool isPinnedPtr(const void* data) const override {
        std::lock_guard<std::mutex> g(pinned_lock);
        return pinned().count(data) != 0;
    }
};

NntileHooks kHooks;

const bool kRegistered = (at::RegisterPrivateUse1HooksInterface(&kHooks), true);

}  // namespace

// The torch this library was compiled against, which the package reads from the file
// before it loads it (backend/native_lib.py, native_library): C++ code compiled against one
// torch release fails to load into another, or loads and misreads its changed classes.
extern "C" __attribute__((used, visibility("default")))
const char tnt_built_against_torch[] = "torch_nntile: built against torch " TORCH_VERSION;
