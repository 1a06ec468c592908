// The openreg generator: a GeneratorImpl on the openreg device whose state is a
// CPU (MT19937) generator, so that the CPU kernels run by the fallback draw from
// it directly and openreg random numbers match the CPU's for a seed.
//
// Random kernels are asynchronous and draw when they run; every host access to
// the state (seeding, get/set state, clone) therefore first waits for the
// device's queued work, so it sees the state in program order, as CUDA's
// launch-time Philox offsets give it.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <mutex>
#include <vector>

#include "allocator.h"
#include "bridge.h"

namespace openreg {
namespace {

// LITERALINCLUDE START: GENERATOR
struct GeneratorImpl final : public c10::GeneratorImpl {
  explicit GeneratorImpl(c10::DeviceIndex index, at::Generator cpu = at::detail::createCPUGenerator())
      : c10::GeneratorImpl(openreg::device(index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)), cpu_(std::move(cpu)) {}

  void drain() const { call("generator_sync", device().index()); }
  void set_current_seed(uint64_t seed) override {
    drain();
    cpu_.set_current_seed(seed);
  }
  // The state is an MT19937 state (like the CPU's), not a Philox seed and offset (like CUDA's).
  void set_offset(uint64_t) override {
    TORCH_CHECK(false, "openreg generators have no offset: their state is a CPU (MT19937) generator state, "
                "not a Philox seed and offset; use get_state()/set_state() instead");
  }
  uint64_t get_offset() const override {
    TORCH_CHECK(false, "openreg generators have no offset: their state is a CPU (MT19937) generator state, "
                "not a Philox seed and offset; use get_state()/set_state() instead");
  }
  // A captured random kernel reads this state when it runs, at each replay: graphs need no graph-safe state.
  c10::intrusive_ptr<c10::GeneratorImpl> graphsafe_get_state() const override {
    TORCH_CHECK(false, "openreg generators have no graph-safe state: a random kernel captured in an openreg graph "
                "draws from the generator's state when it runs (at each replay), so get_state()/set_state() "
                "already save and restore what replays draw; use them instead");
  }
  void graphsafe_set_state(const c10::intrusive_ptr<c10::GeneratorImpl>&) override {
    TORCH_CHECK(false, "openreg generators have no graph-safe state: a random kernel captured in an openreg graph "
                "draws from the generator's state when it runs (at each replay), so get_state()/set_state() "
                "already save and restore what replays draw; use them instead");
  }
  uint64_t current_seed() const override { return cpu_.current_seed(); }
  uint64_t seed() override {
    drain();
    return cpu_.seed();
  }
  void set_state(const c10::TensorImpl& state) override {
    drain();
    cpu_.unsafeGetGeneratorImpl()->set_state(state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    drain();
    return cpu_.unsafeGetGeneratorImpl()->get_state();
  }
  GeneratorImpl* clone_impl() const override {
    drain();
    return new GeneratorImpl(device().index(), cpu_.clone());
  }

  at::Generator cpu_;
};
// LITERALINCLUDE END: GENERATOR

} // namespace

// LITERALINCLUDE START: DEFAULT GENERATORS
const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::once_flag once;
  static std::vector<at::Generator> generators;
  std::call_once(once, [] {
    auto count = call<c10::DeviceIndex>("device_count");
    for (c10::DeviceIndex i = 0; i < count; ++i) {
      generators.push_back(at::make_generator<GeneratorImpl>(i));
    }
  });
  if (index == -1) index = call<c10::DeviceIndex>("get_device");
  TORCH_CHECK(index >= 0 && index < static_cast<c10::DeviceIndex>(generators.size()),
              "invalid device ordinal ", static_cast<int>(index), " for an openreg generator: openreg has ",
              generators.size(), " device(s)");
  return generators[index];
}
// LITERALINCLUDE END: DEFAULT GENERATORS

at::Generator new_generator(c10::DeviceIndex index) {
  if (index == -1) index = call<c10::DeviceIndex>("get_device");
  default_generator(index); // validates the index
  return at::make_generator<GeneratorImpl>(index);
}

at::Generator cpu_generator(const at::Generator& gen) {
  auto* impl = dynamic_cast<GeneratorImpl*>(gen.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl, "expected an openreg generator, got one for ", gen.device());
  return impl->cpu_;
}

} // namespace openreg
