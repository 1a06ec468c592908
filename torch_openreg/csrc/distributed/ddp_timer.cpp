// DDP's runtime statistics for openreg (forward, backward compute and communication times in
// DistributedDataParallel's logging data): c10d looks a Timer up by device type in a C++ registry,
// and without one it warns "Time stats are currently only collected for CPU and CUDA devices".
// Like CUDA's timer, it times on the device: timing events recorded on the current stream, read
// through the device guard (which forwards them to the runtime's events).
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

// LITERALINCLUDE START: DDP TIMER
namespace openreg {
namespace {

class DeviceTimer final : public c10d::Timer {
 public:
  explicit DeviceTimer(c10::Device device) : device_(device) {}

  void record(Event event) override {
    Timer::record(event); // the host timestamp too (DDP reads both)
    c10::impl::VirtualGuardImpl guard(c10::DeviceType::PrivateUse1);
    at(event).record(guard.getStream(device_));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    c10::Event& first = at(start);
    c10::Event& last = at(end);
    if (!first.was_marked_for_recording() || !last.was_marked_for_recording()) {
      return std::nullopt;
    }
    first.synchronize();
    last.synchronize();
    double ms = first.elapsedTime(last);
    if (ms < 0) {
      return std::nullopt; // recorded out of order (the events may sit on different streams)
    }
    return static_cast<int64_t>(ms * 1e6);
  }

 private:
  c10::Event& at(Event event) {
    return events_.at(static_cast<size_t>(event));
  }

  c10::Device device_;
  // BACKEND_DEFAULT: the runtime's events take timestamps (enable_timing)
  std::array<c10::Event, 5> events_{
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT),
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT),
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT),
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT),
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT)};
};

} // namespace
} // namespace openreg

namespace c10d { // the registry's Registerer lives in c10d
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, openreg::DeviceTimer);
} // namespace c10d
// LITERALINCLUDE END: DDP TIMER
