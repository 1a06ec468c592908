// The c10d backend "occl" as c10d sees it: a c10d::Backend and a c10d::Work whose every method
// forwards to a Python object (torch_openreg.distributed.backend.OCCL and .work.Work).
//
// C++ is needed here for one reason: c10d reaches a backend through C++ virtual calls
// (ProcessGroup -> c10d::allreduce_ for PrivateUse1 -> Backend::allreduce), and neither Backend
// nor Work has a Python trampoline in PyTorch 2.13. Everything else (which collective runs how,
// on which stream, what a Work waits for) is decided in Python; this file decides nothing.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include "../bridge.h"

namespace openreg {
namespace {

using c10d::OpType;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using TensorLists = std::vector<std::vector<at::Tensor>>;

// Releases a Python reference from any thread (c10d drops Works on its own threads).
void release(py::object& obj) noexcept {
  if (!obj) return;
  if (!python_alive()) {
    obj.release(); // interpreter gone: leak rather than touch it
    return;
  }
  py::gil_scoped_acquire gil;
  obj = py::object();
}

// LITERALINCLUDE START: OCCL WORK
// A c10d::Work over a Python Work: completion, errors and waiting are the Python object's.
class PyWork final : public c10d::Work {
 public:
  PyWork(py::object work, int rank, OpType type) : c10d::Work(rank, type), work_(std::move(work)) {}
  ~PyWork() override { release(work_); }

  bool isCompleted() override { return ask<bool>("is_completed"); }
  bool isSuccess() const override { return ask<bool>("is_success"); }
  std::exception_ptr exception() const override {
    auto message = ask<std::optional<std::string>>("error_message");
    return message ? std::make_exception_ptr(std::runtime_error(*message)) : nullptr;
  }
  int sourceRank() const override { return ask<int>("source_rank"); }
  std::vector<at::Tensor> result() override { return ask<std::vector<at::Tensor>>("result"); }
  void synchronize() override { ask<void>("synchronize"); }
  bool wait(std::chrono::milliseconds timeout) override { return ask<bool>("wait", timeout.count()); }
  void abort() override { ask<void>("abort"); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    py::gil_scoped_acquire gil;
    try {
      auto type = c10::FutureType::create(c10::ListType::ofTensors());
      return torch::jit::toIValue(work_.attr("get_future")(), type).toFuture();
    } catch (py::error_already_set& error) {
      rethrow(error);
    }
  }

 private:
  template <typename R, typename... Args>
  R ask(const char* method, Args&&... args) const {
    py::gil_scoped_acquire gil;
    try {
      py::object result = work_.attr(method)(std::forward<Args>(args)...);
      if constexpr (!std::is_void_v<R>) {
        return result.template cast<R>();
      }
    } catch (py::error_already_set& error) {
      rethrow(error);
    }
  }

  py::object work_;
};
// LITERALINCLUDE END: OCCL WORK

// LITERALINCLUDE START: OCCL BACKEND
// A c10d::Backend whose collectives are methods of a Python object, each returning a Python Work. Each
// gets its options as plain values, ending with the timeout (ms, -1: the group's) and asyncOp.
class PyBackend final : public c10d::Backend {
 public:
  PyBackend(py::object impl, int rank, int size, std::chrono::milliseconds timeout)
      : c10d::Backend(rank, size), impl_(std::move(impl)),
        options_(c10::make_intrusive<Options>("occl", timeout)) {
    init();
  }
  ~PyBackend() override { release(impl_); }

  const std::string getBackendName() const override { return "occl"; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override { call<void>("start_coalescing"); }
  WorkPtr endCoalescing() override { return work(OpType::COALESCED, "end_coalescing"); }
  void setTimeout(std::chrono::milliseconds timeout) override {
    options_->timeout = timeout;
    call<void>("set_timeout", timeout.count());
  }
  void abort() override { call<void>("abort"); }
  void shutdown() override { call<void>("shutdown"); }

  WorkPtr broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& o) override {
    return work(OpType::BROADCAST, "broadcast", tensors, o.rootRank, o.rootTensor, ms(o.timeout), o.asyncOp);
  }
  WorkPtr allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& o) override {
    return work(OpType::ALLREDUCE, "allreduce", tensors, reduction(o.reduceOp), ms(o.timeout), o.asyncOp);
  }
  WorkPtr allreduce_coalesced(std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& o) override {
    return work(OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors, reduction(o.reduceOp),
                ms(o.timeout), o.asyncOp);
  }
  WorkPtr reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& o) override {
    return work(OpType::REDUCE, "reduce", tensors, reduction(o.reduceOp), o.rootRank, o.rootTensor,
                ms(o.timeout), o.asyncOp);
  }
  WorkPtr allgather(TensorLists& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& o) override {
    return work(OpType::ALLGATHER, "allgather", outputs, inputs, ms(o.timeout), o.asyncOp);
  }
  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& o) override {
    return work(OpType::_ALLGATHER_BASE, "allgather_into_tensor", output, input, ms(o.timeout), o.asyncOp);
  }
  WorkPtr allgather_coalesced(TensorLists& outputs, std::vector<at::Tensor>& inputs,
                              const c10d::AllgatherOptions& o) override {
    return work(OpType::ALLGATHER_COALESCED, "allgather_coalesced", outputs, inputs, ms(o.timeout), o.asyncOp);
  }
  WorkPtr allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllgatherOptions& o) override {
    return work(OpType::COALESCED, "allgather_into_tensor_coalesced", outputs, inputs, ms(o.timeout), o.asyncOp);
  }
  WorkPtr gather(TensorLists& outputs, std::vector<at::Tensor>& inputs, const c10d::GatherOptions& o) override {
    return work(OpType::GATHER, "gather", outputs, inputs, o.rootRank, ms(o.timeout), o.asyncOp);
  }
  WorkPtr scatter(std::vector<at::Tensor>& outputs, TensorLists& inputs, const c10d::ScatterOptions& o) override {
    return work(OpType::SCATTER, "scatter", outputs, inputs, o.rootRank, ms(o.timeout), o.asyncOp);
  }
  WorkPtr reduce_scatter(std::vector<at::Tensor>& outputs, TensorLists& inputs,
                         const c10d::ReduceScatterOptions& o) override {
    return work(OpType::REDUCE_SCATTER, "reduce_scatter", outputs, inputs, reduction(o.reduceOp),
                ms(o.timeout), o.asyncOp);
  }
  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& o) override {
    return work(OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", output, input, reduction(o.reduceOp),
                ms(o.timeout), o.asyncOp);
  }
  WorkPtr reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::ReduceScatterOptions& o) override {
    return work(OpType::REDUCE_SCATTER_TENSOR_COALESCED, "reduce_scatter_tensor_coalesced", outputs, inputs,
                reduction(o.reduceOp), ms(o.timeout), o.asyncOp);
  }
  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                        std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& o) override {
    return work(OpType::ALLTOALL_BASE, "alltoall_base", output, input, output_splits, input_splits, ms(o.timeout),
                o.asyncOp);
  }
  WorkPtr alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                   const c10d::AllToAllOptions& o) override {
    return work(OpType::ALLTOALL, "alltoall", outputs, inputs, ms(o.timeout), o.asyncOp);
  }
  WorkPtr send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return work(OpType::SEND, "send", tensors, dst, tag);
  }
  WorkPtr recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return work(OpType::RECV, "recv", tensors, src, tag);
  }
  WorkPtr recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return work(OpType::RECVANYSOURCE, "recv", tensors, -1, tag);
  }
  WorkPtr barrier(const c10d::BarrierOptions& o) override {
    std::optional<int64_t> device;
    if (o.device && o.device->is_privateuseone()) device = o.device->index();
    if (!device && !o.device_ids.empty()) device = o.device_ids.front();
    return work(OpType::BARRIER, "barrier", device, ms(o.timeout), o.asyncOp);
  }

 private:
  static int64_t ms(std::chrono::milliseconds timeout) { return timeout.count(); } // -1: the group's timeout
  // (ReduceOp.RedOpType, PREMUL_SUM's factor as a float or as a one-element tensor): plain values,
  // turned into Python objects by the call (which holds the GIL)
  using Reduction = std::tuple<int, std::optional<double>, std::optional<at::Tensor>>;
  static Reduction reduction(const c10d::ReduceOp& reduce) {
    Reduction out{static_cast<int>(reduce.op_), std::nullopt, std::nullopt};
    auto* premul = dynamic_cast<const c10d::PreMulSumSupplement*>(reduce.supplement_.get());
    if (reduce.op_ == c10d::ReduceOp::PREMUL_SUM && premul != nullptr) {
      if (premul->tensor_factor.defined()) {
        std::get<2>(out) = premul->tensor_factor;
      } else {
        std::get<1>(out) = premul->double_factor;
      }
    }
    return out;
  }

  template <typename R, typename... Args>
  R call(const char* method, Args&&... args) {
    py::gil_scoped_acquire gil;
    try {
      py::object result = impl_.attr(method)(std::forward<Args>(args)...);
      if constexpr (!std::is_void_v<R>) {
        return result.template cast<R>();
      }
    } catch (py::error_already_set& error) {
      rethrow(error);
    }
  }

  template <typename... Args>
  WorkPtr work(OpType type, const char* method, Args&&... args) {
    py::gil_scoped_acquire gil; // the Python Work changes hands here
    return c10::make_intrusive<PyWork>(call<py::object>(method, std::forward<Args>(args)...), getRank(), type);
  }

  py::object impl_;
  c10::intrusive_ptr<Options> options_;
};
// LITERALINCLUDE END: OCCL BACKEND

} // namespace

// LITERALINCLUDE START: OCCL BIND
void bind_distributed(py::module& m) {
  m.def(
      "_occl_backend",
      [](py::object impl, int rank, int size, int64_t timeout_ms) -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<PyBackend>(std::move(impl), rank, size, std::chrono::milliseconds(timeout_ms));
      },
      "a c10d::Backend forwarding every collective to the Python object impl");
}
// LITERALINCLUDE END: OCCL BIND

} // namespace openreg
