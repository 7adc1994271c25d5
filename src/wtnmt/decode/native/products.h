// The products of the native engine (engine.cpp): x·Wᵀ as the PyTorch engine multiplies.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/quantized/PackedParams.h>
#include <torch/extension.h>

#include <optional>
#include <string>

namespace wtnmt_native {

using at::Tensor;
using Int8 = c10::intrusive_ptr<LinearPackedParamsBase>;

// x·Wᵀ (+ b) as model/packed.py's PackedLinear computes it: oneDNN's packed float32 product,
// FBGEMM's dynamically quantised int8 one (bias packed in), or a plain matmul by an [in, out]
// matrix (the weighted self-attention's merge, which the PyTorch engine never packs).
struct Product {
  int kind = 0;   // 0 oneDNN, 1 int8, 2 matmul
  Tensor weight;  // oneDNN-packed [out, in], or the [in, out] matrix of kind 2
  std::optional<Tensor> bias;
  Int8 int8;
};

inline Tensor onednn_linear(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&,
                                     c10::string_view, c10::List<std::optional<at::Scalar>>,
                                     std::optional<c10::string_view>)>();
  return op.call(x, w, b, "none", c10::List<std::optional<at::Scalar>>(), std::string(""));
}

// FBGEMM's dynamically quantised product, through the dispatcher as the PyTorch engine calls it
// (so that the profiler sees it too)
inline Tensor int8_linear(const Tensor& x, const Int8& w, bool reduce_range) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("quantized::linear_dynamic", "")
                       .typed<Tensor(Tensor, const Int8&, bool)>();
  return op.call(x, w, reduce_range);
}

inline bool g_reduce_range = true;  // FBGEMM: 7-bit activations (model/packed.py)

// a Python float in an operator call (a wrapped number: computed in the tensor's dtype)
inline Tensor scalar(double value) {
  Tensor t = c10::scalar_to_tensor(value);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

inline Tensor apply(const Product& p, const Tensor& x) {
  switch (p.kind) {
    case 0:
      return onednn_linear(x, p.weight, p.bias);
    case 1:
      return int8_linear(x, p.int8, g_reduce_range);
    default:
      return x.matmul(p.weight);
  }
}

}  // namespace wtnmt_native
