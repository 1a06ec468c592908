// The profiler's C++ registration points, each forwarding to torch_openreg.profiler (Python):
//  * Kineto: an IActivityProfiler registered with REGISTER_PRIVATEUSE1_PROFILER. Kineto creates one
//    session per trace, tells it the correlation id of every operator entered on a thread, and asks
//    it for its activities when the trace stops; torch_openreg.profiler.kineto builds them from the
//    runtime's launch records.
//  * the legacy stubs (torch/csrc/profiler/stubs/base.h) behind use_device="openreg" without
//    Kineto: device events recorded around every operator, timed by torch_openreg.profiler.legacy.
//  * memory events for profile_memory=True (c10::reportMemoryUsageToProfiler), which the caching
//    allocator, being Python, cannot report itself.
// No policy here: what is recorded, how a launch becomes an activity, which rows a trace has is
// decided in Python.
#define USE_KINETO 1 // the wheel is built with Kineto; its PrivateUse1 registry sits behind this macro
#define FMT_HEADER_ONLY 1 // Kineto's metadata formats with fmt, whose compiled part the wheel does not export
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/ApproximateClock.h>
#include <libkineto.h>
#include <output_base.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bridge.h"

namespace openreg {
namespace {

// torch_openreg.profiler.<name>, imported on first use and kept for the process (like runtime()).
py::object& profiler_module(const char* name) {
  static py::object* kineto = new py::object(py::module_::import("torch_openreg.profiler.kineto"));
  static py::object* legacy = new py::object(py::module_::import("torch_openreg.profiler.legacy"));
  static py::object* memory = new py::object(py::module_::import("torch_openreg.profiler.memory"));
  if (name[0] == 'k') return *kineto;
  return name[0] == 'l' ? *legacy : *memory;
}

template <typename R = void, typename... Args>
R call_profiler(const char* module, const char* name, Args&&... args) {
  py::gil_scoped_acquire gil;
  py::error_scope pending;
  try {
    py::object result = profiler_module(module).attr(name)(std::forward<Args>(args)...);
    if constexpr (!std::is_void_v<R>) {
      return result.template cast<R>();
    }
  } catch (py::error_already_set& error) {
    rethrow(error);
  }
}

// LITERALINCLUDE START: CORRELATION STACKS
// The correlation ids of the operators (and record_function ranges) open on this thread, innermost
// last, as Kineto pushes and pops them. A launch reads them: the innermost operator launched it.
thread_local std::vector<uint64_t> t_correlation;
thread_local std::vector<uint64_t> t_user_correlation;

// (innermost operator, every open record_function range from the outermost): a launch's device work
// is charged to the operator and lies inside each of the ranges.
py::tuple current_correlation() {
  py::tuple ranges(t_user_correlation.size());
  for (size_t i = 0; i < t_user_correlation.size(); ++i) ranges[i] = py::int_(t_user_correlation[i]);
  return py::make_tuple(t_correlation.empty() ? 0 : t_correlation.back(), ranges);
}
// LITERALINCLUDE END: CORRELATION STACKS

// LITERALINCLUDE START: KINETO SESSION
class Session final : public libkineto::IActivityProfilerSession {
 public:
  Session() {
    trace_->span = libkineto::TraceSpan(0, 0, "openreg", "");
    trace_->gpuOpCount = -1;
  }
  void start() override { call_profiler("kineto", "start"); }
  void stop() override { call_profiler("kineto", "stop"); }
  void pushCorrelationId(uint64_t id) override { t_correlation.push_back(id); }
  void popCorrelationId() override {
    if (!t_correlation.empty()) t_correlation.pop_back();
  }
  void pushUserCorrelationId(uint64_t id) override { t_user_correlation.push_back(id); }
  void popUserCorrelationId() override {
    if (!t_user_correlation.empty()) t_user_correlation.pop_back();
  }
  std::vector<std::string> errors() override { return {}; }
  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  // Python returns the rows (devices, streams) and the activities; each activity names the
  // correlation id of the operator it belongs to, which Kineto resolves to that operator's activity.
  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked,
                    int64_t start_ns, int64_t end_ns) override {
    py::gil_scoped_acquire gil;
    py::tuple trace = call_profiler<py::tuple>("kineto", "collect", start_ns, end_ns, libkineto::processId());
    for (auto row : trace[0].cast<py::list>()) { // (pid, sort index, name, label)
      auto d = row.cast<py::tuple>();
      libkineto::DeviceInfo info{d[0].cast<int64_t>(), d[1].cast<int64_t>(), d[2].cast<std::string>(),
                                 d[3].cast<std::string>()};
      logger.handleDeviceInfo(info, start_ns);
      if (!device_) device_ = std::make_unique<libkineto::DeviceInfo>(info);
    }
    for (auto row : trace[1].cast<py::list>()) { // (tid, sort index, pid, name)
      auto r = row.cast<py::tuple>();
      logger.handleResourceInfo({r[0].cast<int64_t>(), r[1].cast<int64_t>(), r[2].cast<int64_t>(),
                                 r[3].cast<std::string>()}, start_ns);
    }
    // (type, name, pid, tid, start ns, end ns, correlation, linked correlation, flow id, flow start, metadata)
    for (auto row : trace[2].cast<py::list>()) {
      auto a = row.cast<py::tuple>();
      auto type = static_cast<libkineto::ActivityType>(a[0].cast<int>());
      auto name = a[1].cast<std::string>();
      if (name.empty()) { // a record_function range's device span: named after the range
        const auto* range = linked(a[6].cast<int32_t>());
        name = range ? range->name() : "record_function";
      }
      trace_->emplace_activity(trace_->span, type, name);
      auto& act = *trace_->activities.back();
      act.device = a[2].cast<int32_t>();
      act.resource = a[3].cast<int32_t>();
      act.threadId = act.resource;
      act.startTime = a[4].cast<int64_t>();
      act.endTime = a[5].cast<int64_t>();
      act.id = a[6].cast<int32_t>();
      auto link = a[7].cast<int32_t>();
      act.linked = link ? linked(link) : nullptr;
      act.flow.id = a[8].cast<uint32_t>();
      act.flow.type = act.flow.id ? libkineto::kLinkAsyncCpuGpu : 0;
      act.flow.start = a[9].cast<bool>();
      for (auto item : a[10].cast<py::dict>()) {
        if (py::isinstance<py::str>(item.second)) {
          act.addMetadataQuoted(item.first.cast<std::string>(), item.second.cast<std::string>());
        } else {
          act.addMetadata(item.first.cast<std::string>(), py::str(item.second).cast<std::string>());
        }
      }
      act.log(logger);
    }
  }
  // One row suffices to keep Kineto from adding its default "GPU 0".."GPU 15" rows.
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override { return std::move(device_); }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(trace_); }

 private:
  std::unique_ptr<libkineto::DeviceInfo> device_;
  std::unique_ptr<libkineto::CpuTraceBuffer> trace_ = std::make_unique<libkineto::CpuTraceBuffer>();
};

class OpenRegActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return types_; }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config&) override {
    // Only a trace of PrivateUse1 activity asks for device kernels; a CPU-only trace also lists
    // PRIVATEUSE1_RUNTIME (PyTorch's CPU activity types) and gets no session: no device rows.
    if (!types.count(libkineto::ActivityType::CONCURRENT_KERNEL) && !types.count(libkineto::ActivityType::GPU_MEMCPY)) {
      return nullptr;
    }
    return std::make_unique<Session>();
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_ = "openreg";
  std::set<libkineto::ActivityType> types_ = {
      libkineto::ActivityType::CONCURRENT_KERNEL, libkineto::ActivityType::GPU_MEMCPY,
      libkineto::ActivityType::GPU_USER_ANNOTATION, libkineto::ActivityType::PRIVATEUSE1_RUNTIME};
};

REGISTER_PRIVATEUSE1_PROFILER(OpenRegActivityProfiler);
// LITERALINCLUDE END: KINETO SESSION

// LITERALINCLUDE START: LEGACY STUBS
// use_device="openreg" without Kineto (KINETO_PRIVATEUSE1_FALLBACK): PyTorch records a device event
// when each operator starts and ends and asks for the time between them.
struct LegacyStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    py::gil_scoped_acquire gil;
    auto recorded = call_profiler<py::tuple>("legacy", "record");
    if (device) *device = recorded[0].cast<c10::DeviceIndex>();
    auto* held = new py::object(recorded[1]);
    *event = std::shared_ptr<void>(held, [](void* p) {
      if (!python_alive()) return; // exiting: the interpreter releases the event itself
      py::gil_scoped_acquire gil;
      delete static_cast<py::object*>(p);
    });
    if (cpu_ns) *cpu_ns = c10::getTime();
  }
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    py::gil_scoped_acquire gil;
    return call_profiler<float>("legacy", "elapsed_us", *static_cast<py::object*>(start->get()),
                                *static_cast<py::object*>(end->get()));
  }
  void mark(const char* name) const override { call_profiler("legacy", "mark", std::string(name)); }
  void rangePush(const char* name) const override { call_profiler("legacy", "range_push", std::string(name)); }
  void rangePop() const override { call_profiler("legacy", "range_pop"); }
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    auto count = call<c10::DeviceIndex>("device_count");
    for (c10::DeviceIndex i = 0; i < count; ++i) {
      c10::DeviceGuard guard(device(i));
      op(i);
    }
  }
  void synchronize() const override { call_profiler("legacy", "synchronize"); }
};

struct RegisterLegacyStubs {
  RegisterLegacyStubs() {
    static LegacyStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} register_legacy_stubs;
// LITERALINCLUDE END: LEGACY STUBS

} // namespace

// LITERALINCLUDE START: MEMORY EVENTS
// profile_memory=True: each allocation and free is reported with the allocator's totals after it, as
// CUDA's caching allocator does. memoryProfilingEnabled() is a thread-local check: outside a profiler
// that records memory, nothing is asked of Python.
void report_allocation(void* ptr, c10::DeviceIndex index) {
  if (ptr == nullptr || !c10::memoryProfilingEnabled()) return;
  auto info = call_profiler<std::tuple<int64_t, int64_t, int64_t>>("memory", "allocated",
                                                                   reinterpret_cast<uintptr_t>(ptr));
  c10::reportMemoryUsageToProfiler(ptr, std::get<0>(info), std::get<1>(info), std::get<2>(info), device(index));
}

bool free_reported(void* ptr) noexcept {
  if (!c10::memoryProfilingEnabled() || !python_alive()) return false;
  py::gil_scoped_acquire gil;
  py::error_scope pending;
  try { // (device, size, allocated, reserved) after the free, or None for memory the allocator did not hand out
    py::object info = profiler_module("memory").attr("free")(reinterpret_cast<uintptr_t>(ptr));
    if (!info.is_none()) {
      auto t = info.cast<std::tuple<c10::DeviceIndex, int64_t, int64_t, int64_t>>();
      c10::reportMemoryUsageToProfiler(ptr, -std::get<1>(t), std::get<2>(t), std::get<3>(t), device(std::get<0>(t)));
    }
  } catch (py::error_already_set& error) {
    error.discard_as_unraisable("free");
  } catch (...) {
  }
  return true;
}
// LITERALINCLUDE END: MEMORY EVENTS

void bind_profiler(py::module& m) {
  m.def("_profiler_correlation", &current_correlation,
        "(operator, record_function) correlation ids open on this thread while Kineto traces openreg");
  m.def("_profiler_registered", [] { return torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().hasFactory(); },
        "whether openreg's Kineto profiler is registered with PyTorch");
}

} // namespace openreg
