// The block cache (a fast path of the device allocator, OPENREG_CPP_LAUNCH): a tensor's freed block is
// kept here, still allocated in the caching allocator's books, and handed to the next allocation of the
// same size on the same stream without a call into Python. What the cache may hold and serve is decided in
// Python (torch_openreg/_runtime.py's block_cache_key, per allocation); everything else (a different size, a
// different stream, history, pools, the sanitizer) goes to the Python allocator, after the cache has given
// its blocks back (block_cache_flush), so that the allocator's statistics are exact whenever the allocator
// itself runs or is read (docs/memory.md, "The bridge's block cache").
#include "block_cache.h"

#include <c10/util/Exception.h>
#include <pybind11/stl.h>

#include <atomic>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bridge.h"

namespace openreg {
namespace {

struct Known { // a block the cache may hold: from an allocation the Python side allowed
  c10::DeviceIndex device;
  int64_t stream;
  size_t nbytes;    // as requested: only an allocation of exactly this size reuses it
  int64_t hits = 0; // reuses not yet told to the allocator (each an elided free and malloc)
  bool held = false;
  bool excluded = false; // record_stream or a graph watches it: its free goes to Python
};

struct Held {
  void* ptr;
  size_t nbytes;
  int64_t stream;
};

constexpr size_t kMaxHeld = 64; // per device; beyond it a free goes to Python

std::mutex g_mutex;
std::unordered_map<void*, Known> g_known;
std::vector<std::vector<Held>> g_held; // per device, newest last
std::vector<std::vector<void*>> g_hit; // per device: the blocks with untold hits
std::vector<char> g_dirty;             // per device: held blocks or untold hits
std::atomic<bool> g_enabled{false};
int64_t g_hits_total = 0; // for tests and benchmarks (_block_cache_info)

void ensure_device(c10::DeviceIndex device) {
  if (static_cast<size_t>(device) >= g_held.size()) {
    g_held.resize(device + 1);
    g_hit.resize(device + 1);
    g_dirty.resize(device + 1, 0);
  }
}

// Take what the allocator must be told for ``device`` out of the cache (under the lock).
std::pair<std::vector<std::pair<uintptr_t, int64_t>>, std::vector<uintptr_t>> take_all(c10::DeviceIndex device) {
  std::vector<std::pair<uintptr_t, int64_t>> hits;
  std::vector<uintptr_t> frees;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (static_cast<size_t>(device) >= g_held.size() || !g_dirty[device]) return {};
  g_dirty[device] = 0;
  for (void* ptr : g_hit[device]) {
    auto found = g_known.find(ptr);
    if (found != g_known.end() && found->second.hits) {
      hits.emplace_back(reinterpret_cast<uintptr_t>(ptr), found->second.hits);
      found->second.hits = 0;
    }
  }
  g_hit[device].clear();
  for (const auto& held : g_held[device]) {
    frees.push_back(reinterpret_cast<uintptr_t>(held.ptr));
    g_known.erase(held.ptr);
  }
  g_held[device].clear();
  return {std::move(hits), std::move(frees)};
}

} // namespace

bool block_cache_enabled() { return g_enabled.load(std::memory_order_relaxed); }

// LITERALINCLUDE START: BLOCK CACHE TAKE
bool block_cache_holds(size_t nbytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const auto& held : g_held) {
    for (const auto& block : held) {
      if (block.nbytes == nbytes) return true;
    }
  }
  return false;
}

void* block_cache_take(c10::DeviceIndex device, int64_t stream, size_t nbytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (static_cast<size_t>(device) >= g_held.size()) return nullptr;
  auto& held = g_held[device];
  for (size_t i = held.size(); i-- > 0;) {
    if (held[i].nbytes == nbytes && held[i].stream == stream) {
      void* ptr = held[i].ptr;
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
      auto& known = g_known.at(ptr);
      known.held = false;
      if (known.hits++ == 0) g_hit[device].push_back(ptr);
      ++g_hits_total;
      g_dirty[device] = 1;
      return ptr;
    }
  }
  return nullptr;
}

void block_cache_adopt(void* ptr, c10::DeviceIndex device, int64_t stream, size_t nbytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  ensure_device(device);
  g_known[ptr] = Known{device, stream, nbytes};
}

bool block_cache_put(void* ptr) {
  if (!block_cache_enabled()) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto found = g_known.find(ptr);
  if (found == g_known.end()) return false;
  auto& known = found->second;
  auto& held = g_held[known.device];
  if (known.excluded || known.held || held.size() >= kMaxHeld) return false;
  known.held = true;
  held.push_back(Held{ptr, known.nbytes, known.stream});
  g_dirty[known.device] = 1;
  return true;
}
// LITERALINCLUDE END: BLOCK CACHE TAKE

void block_cache_forget(void* ptr) {
  int64_t hits = 0;
  c10::DeviceIndex device = 0;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto found = g_known.find(ptr);
    if (found == g_known.end()) return;
    hits = found->second.hits;
    device = found->second.device;
    g_known.erase(found);
  }
  if (hits) {
    std::vector<std::pair<uintptr_t, int64_t>> told{{reinterpret_cast<uintptr_t>(ptr), hits}};
    call_quietly("block_cache_settle", device, told, std::vector<uintptr_t>{});
  }
}

void block_cache_flush(c10::DeviceIndex device) {
  if (device < 0) { // every device
    c10::DeviceIndex count = 0;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      count = static_cast<c10::DeviceIndex>(g_held.size());
    }
    for (c10::DeviceIndex d = 0; d < count; ++d) block_cache_flush(d);
    return;
  }
  auto [hits, frees] = take_all(device);
  if (!hits.empty() || !frees.empty()) call("block_cache_settle", device, hits, frees);
}

void bind_block_cache(py::module& m) {
  m.def("_enable_block_cache", [](bool on) { g_enabled.store(on); },
        "let the device allocator keep freed blocks for same-size allocations on their stream (OPENREG_CPP_LAUNCH)");
  m.def("_flush_block_cache", &block_cache_flush, py::arg("device"),
        "give the blocks the cache holds back to the caching allocator and tell it the reuses since the last flush");
  m.def("_block_cache_exclude", [](uintptr_t ptr) {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto found = g_known.find(reinterpret_cast<void*>(ptr));
    if (found != g_known.end()) found->second.excluded = true;
  }, py::arg("ptr"), "the block at ptr is freed through Python (record_stream, a graph watches it)");
  m.def("_block_cache_info", [] {
    std::lock_guard<std::mutex> lock(g_mutex);
    size_t held = 0;
    for (const auto& blocks : g_held) held += blocks.size();
    return std::make_tuple(g_enabled.load(), g_hits_total, held);
  }, "(enabled, reuses served so far, blocks held now)");
}

} // namespace openreg
