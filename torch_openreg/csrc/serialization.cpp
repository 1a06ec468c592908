// Backend metadata of openreg tensors and its serialization: the one place
// PyTorch lets a backend attach its own data to a TensorImpl (c10::BackendMeta)
// and carry it through torch.save/torch.load (TensorBackendMetaRegistry, C++ only).
#include <ATen/core/Tensor.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>

#include <optional>
#include <string>
#include <unordered_map>

#include "bridge.h"

namespace openreg {
namespace {

// LITERALINCLUDE START: BACKEND META
// What a vendor would keep per tensor (e.g. an internal memory format): a small number.
struct BackendMeta final : public c10::BackendMeta {
  explicit BackendMeta(int64_t format) : format(format) {}
  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>&) const override {
    return c10::make_intrusive<BackendMeta>(format);
  }
  int64_t format;
};

// The serialized metadata is a map from string to bool, so the number travels in the key.
constexpr const char* kFormatKey = "openreg_format=";

void for_serialization(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  auto* meta = dynamic_cast<BackendMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
  if (meta != nullptr) metadata[kFormatKey + std::to_string(meta->format)] = true;
}

void for_deserialization(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  for (const auto& [key, value] : metadata) {
    if (value && key.rfind(kFormatKey, 0) == 0) {
      auto format = std::stoll(key.substr(std::string(kFormatKey).size()));
      t.unsafeGetTensorImpl()->set_backend_meta(c10::make_intrusive<BackendMeta>(format));
    }
  }
}
// LITERALINCLUDE END: BACKEND META

void check_openreg(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_privateuseone(), "openreg backend metadata needs an openreg tensor, got one on ",
              t.device());
}

} // namespace

void register_serialization() {
  // LITERALINCLUDE START: BACKEND META REGISTRY
  torch::jit::TensorBackendMetaRegistry(c10::DeviceType::PrivateUse1, &for_serialization, &for_deserialization);
  // LITERALINCLUDE END: BACKEND META REGISTRY
}

void set_backend_meta(const at::Tensor& t, int64_t format) {
  check_openreg(t);
  t.unsafeGetTensorImpl()->set_backend_meta(c10::make_intrusive<BackendMeta>(format));
}

std::optional<int64_t> get_backend_meta(const at::Tensor& t) {
  check_openreg(t);
  auto* meta = dynamic_cast<BackendMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
  return meta == nullptr ? std::nullopt : std::optional<int64_t>(meta->format);
}

void copy_backend_meta(const at::Tensor& src, const at::Tensor& dst) {
  check_openreg(src);
  check_openreg(dst);
  auto meta = src.unsafeGetTensorImpl()->get_backend_meta_intrusive_ptr();
  dst.unsafeGetTensorImpl()->set_backend_meta(meta ? meta->clone(meta) : nullptr);
}

} // namespace openreg
