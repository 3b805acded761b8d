// The device guard of the nntile device, in C++.
//
// PyTorch asks a device's guard for its device and stream around every autograd node
// and every factory call (a small GPT-2 training step: about 800 times). The guard
// PyTorch installs for a backend written in Python answers each question by calling
// back into Python for the device type, taking the GIL on autograd's thread. nntile has
// one device and no streams (StarPU orders the work), so every answer is a constant:
// this guard gives the same answers with no Python. It replaces the Python one when
// this library loads (backend/table_data.py); where the library was not built, the
// Python guard stays and gives the same answers, more slowly.
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace {

constexpr c10::DeviceType kNntile = c10::DeviceType::PrivateUse1;

struct NntileGuard final : public c10::impl::DeviceGuardImplInterface {
    c10::DeviceType type() const override { return kNntile; }
    c10::Device getDevice() const override { return c10::Device(kNntile, 0); }
    c10::Device exchangeDevice(c10::Device) const override { return getDevice(); }
    void setDevice(c10::Device) const override {}
    void uncheckedSetDevice(c10::Device) const noexcept override {}
    c10::DeviceIndex deviceCount() const noexcept override { return 1; }

    // One stream, the default: tasks are ordered by their data, not by streams.
    c10::Stream getStream(c10::Device) const noexcept override { return defaultStream(); }
    c10::Stream getNewStream(c10::Device, int) const override { return defaultStream(); }
    c10::Stream exchangeStream(c10::Stream) const noexcept override { return defaultStream(); }
    bool queryStream(const c10::Stream&) const override { return true; }
    void synchronizeStream(const c10::Stream&) const override {}

    // Events have nothing to wait for: a readout waits for its value's tasks itself.
    void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
    void block(void*, const c10::Stream&) const override {}
    bool queryEvent(void*) const override { return true; }
    void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}

  private:
    static c10::Stream defaultStream() { return c10::Stream(c10::Stream::DEFAULT, c10::Device(kNntile, 0)); }
};

const NntileGuard kGuard;

// Runs when the library is loaded, after the Python backend registered its guard.
const bool kInstalled = (c10::impl::registerDeviceGuard(kNntile, &kGuard), true);

}  // namespace
