// Backend metadata of openreg tensors and its serialization: the one place
// PyTorch lets a backend attach its own data to a TensorImpl (c10::BackendMeta)
// and carry it through torch.save/torch.load (TensorBackendMetaRegistry, C++ only).
#include <ATen/core/Tensor.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>

#include <map>
#include <string>
#include <unordered_map>

#include "bridge.h"

namespace openreg {
namespace {

// LITERALINCLUDE START: BACKEND META
// What a vendor keeps per tensor beyond sizes, strides and dtype (a storage format, a layout
// version, ...), held in the form PyTorch serializes tensor metadata: named flags. A number
// travels in a flag's name ("openreg_format=29": true), as vendors do, since the values are bools.
struct BackendMeta final : public c10::BackendMeta {
  explicit BackendMeta(std::map<std::string, bool> entries) : entries(std::move(entries)) {}
  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>&) const override {
    return c10::make_intrusive<BackendMeta>(entries);
  }
  std::map<std::string, bool> entries;
};

BackendMeta* backend_meta(const at::Tensor& t) {
  return dynamic_cast<BackendMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
}

// torch._utils.get_tensor_metadata, torch.save: add the tensor's flags to the map (which already
// holds PyTorch's own "conj"/"neg").
void for_serialization(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  if (auto* meta = backend_meta(t)) {
    metadata.insert(meta->entries.begin(), meta->entries.end());
  }
}

// torch._utils.set_tensor_metadata, torch.load: PyTorch has taken "conj"/"neg" out; the rest is
// the backend's. A map without backend entries leaves the tensor's metadata as it is.
void for_deserialization(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  if (!metadata.empty()) {
    t.unsafeGetTensorImpl()->set_backend_meta(
        c10::make_intrusive<BackendMeta>(std::map<std::string, bool>(metadata.begin(), metadata.end())));
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

// The backend metadata of src (or none) cloned onto dst, which may be a fake tensor standing for an
// openreg tensor (its TensorImpl is a meta one): what torch._C._copy_backend_meta does in newer PyTorch.
void copy_backend_meta(const at::Tensor& src, const at::Tensor& dst) {
  check_openreg(src);
  auto meta = src.unsafeGetTensorImpl()->get_backend_meta_intrusive_ptr();
  dst.unsafeGetTensorImpl()->set_backend_meta(meta ? meta->clone(meta) : nullptr);
}

} // namespace openreg
