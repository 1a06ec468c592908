// Lets a functional CPU kernel allocate its outputs straight in device memory (an acceleration of
// the fallback: torch_openreg/aten/fast/served_outputs.py).
//
// Many CPU operators have no real out= kernel (convolution, layer norm: PyTorch's
// generated out= overload runs the functional kernel and copies its result). A
// kernel of the fallback that runs such an operator names, before the call, the
// device buffers its outputs go to; while the call runs, an allocation of exactly
// one of those sizes on the calling thread is served from that buffer instead of
// the CPU allocator, so the operator computes in place and nothing is copied.
// Which buffers, and checking that each result did land where it belongs, is the
// fallback's business (ServedKernel); this file only serves the allocations it was told about.
//
// Serving needs a CPU allocator in front of PyTorch's for the whole process (c10::SetCPUAllocator
// has no per-thread form): install_cpu_output_allocator() puts it there when the accelerations are
// turned on (torch_openreg.aten.fast.install), never as a side effect of loading this extension.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/utils/pybind.h>

#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace openreg {
namespace {

// An output of this thread's kernel: its size, its device buffer (null once handed out or when it
// cannot be served), how many allocations of its size to let through before it is served, and every
// allocation of its size during the call (so that the kernel can learn which one its result was).
struct Target {
  size_t nbytes;
  void* buffer;
  int64_t skip;
  std::vector<uintptr_t> seen;
};
thread_local std::vector<Target> t_targets;
thread_local uint64_t t_call = 0; // which kernel call of this thread the targets belong to

// Buffers handed out and not released yet, with the thread and call that asked: a library that kept
// one after its call returned would later write into memory another tensor owns, so the fallback checks.
std::mutex g_mutex;
std::unordered_map<void*, std::pair<std::thread::id, uint64_t>> g_served;
c10::DeleterFnPtr g_cpu_raw_deleter = nullptr;

bool release_served(void* ptr) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_served.erase(ptr) > 0;
}

void release(void* ptr) { release_served(ptr); } // the buffer itself belongs to an openreg tensor

// raw_allocate/raw_deallocate (oneDNN's scratch memory comes this way) free through raw_deleter().
void raw_delete(void* ptr) {
  if (!release_served(ptr)) g_cpu_raw_deleter(ptr);
}

// LITERALINCLUDE START: CPU OUTPUT ALLOCATOR
struct CPUOutputAllocator final : public c10::Allocator {
  c10::Allocator* cpu = nullptr; // the CPU allocator this one stands in front of

  c10::DataPtr allocate(size_t nbytes) override {
    Target* next = nullptr; // the first output of this size still to be served
    bool watched = false;
    for (auto& target : t_targets) {
      if (target.nbytes != nbytes || nbytes == 0) continue;
      watched = true;
      if (next == nullptr && target.buffer != nullptr) next = &target;
    }
    if (!watched) return cpu->allocate(nbytes);
    if (next != nullptr && next->skip > 0) { // a temporary of the output's size comes first in this operator
      --next->skip;
      next = nullptr;
    }
    c10::DataPtr out;
    if (next != nullptr) {
      void* buffer = std::exchange(next->buffer, nullptr);
      {
        std::lock_guard<std::mutex> lock(g_mutex);
        g_served.emplace(buffer, std::make_pair(std::this_thread::get_id(), t_call));
      }
      out = c10::DataPtr(buffer, buffer, &release, c10::Device(c10::kCPU));
    } else {
      out = cpu->allocate(nbytes);
    }
    for (auto& target : t_targets) {
      if (target.nbytes == nbytes) target.seen.push_back(reinterpret_cast<uintptr_t>(out.get()));
    }
    return out;
  }
  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }
  void copy_data(void* dst, const void* src, std::size_t count) const override { cpu->copy_data(dst, src, count); }
};
// LITERALINCLUDE END: CPU OUTPUT ALLOCATOR

CPUOutputAllocator g_cpu_outputs;

} // namespace

// LITERALINCLUDE START: CPU OUTPUT TARGETS
// Serve this thread's next CPU allocations of these tensors' sizes from their memory, each after
// letting ``skips[i]`` allocations of its size through (an empty list stops it). Only dense,
// non-overlapping tensors qualify: their bytes are one range. Returns, for the previous targets,
// the addresses of the allocations of their sizes, in order.
std::vector<std::vector<uintptr_t>> set_cpu_output_targets(const std::vector<at::Tensor>& tensors,
                                                           const std::vector<int64_t>& skips) {
  TORCH_CHECK(tensors.empty() || c10::GetCPUAllocator() == &g_cpu_outputs,
              "openreg: CPU outputs can only be served once the allocator is installed "
              "(_install_cpu_output_allocator, done by torch_openreg.aten.fast.install)");
  std::vector<std::vector<uintptr_t>> seen;
  for (auto& target : t_targets) seen.push_back(std::move(target.seen));
  t_targets.clear();
  if (!tensors.empty()) ++t_call;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    bool dense = t.defined() && t.numel() > 0 && t.is_non_overlapping_and_dense();
    t_targets.push_back({dense ? t.numel() * t.element_size() : 0, dense ? t.data_ptr() : nullptr,
                         i < skips.size() ? skips[i] : 0, {}});
  }
  return seen;
}

// How many buffers served to this thread's last kernel call are still held (0 once its results are
// gone; a buffer an earlier call kept was reported then).
size_t cpu_outputs_held() {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto me = std::make_pair(std::this_thread::get_id(), t_call);
  size_t held = 0;
  for (const auto& entry : g_served) held += entry.second == me;
  return held;
}
// LITERALINCLUDE END: CPU OUTPUT TARGETS

// LITERALINCLUDE START: INSTALL CPU OUTPUT ALLOCATOR
// Put the allocator in front of PyTorch's CPU allocator, for every CPU allocation of the process; it
// passes each one through unless this thread's kernel named targets. Idempotent; there is no undo
// (c10 keeps no previous allocator), so it is installed only when the accelerations are on.
bool install_cpu_output_allocator() {
  static std::once_flag once;
  bool installed = false;
  std::call_once(once, [&] {
    g_cpu_outputs.cpu = c10::GetCPUAllocator();
    g_cpu_raw_deleter = g_cpu_outputs.cpu->raw_deleter();
    c10::SetCPUAllocator(&g_cpu_outputs, /*priority=*/1);
    installed = true;
  });
  return installed;
}

bool cpu_output_allocator_installed() { return c10::GetCPUAllocator() == &g_cpu_outputs; }
// LITERALINCLUDE END: INSTALL CPU OUTPUT ALLOCATOR

} // namespace openreg
