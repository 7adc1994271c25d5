// The products of the native engine (engine.cpp): x·Wᵀ as the PyTorch engine multiplies.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <ATen/native/quantized/PackedParams.h>
#include <torch/extension.h>

#include "int8.h"

#include <memory>
#include <optional>
#include <string>

namespace wtnmt_native {

using at::Tensor;
using Int8 = c10::intrusive_ptr<LinearPackedParamsBase>;

// x·Wᵀ (+ b) as model/packed.py's PackedLinear computes it: oneDNN's packed float32 product
// or MKL's by the weight transposed to [in, out] (model/float32_kernels.py: the same call),
// FBGEMM's (or oneDNN's) dynamically quantised int8 one (bias packed in), or a plain matmul by
// an [in, out] matrix (the weighted self-attention's merge, which the PyTorch engine never
// packs); or the same int8 product in the engine's own kernel (int8.h) on the same weights.
struct Product {
  int kind = 0;   // 0 oneDNN, 1 int8, 2 matmul, 3 int8 in int8.h's kernel, 4 MKL
  Tensor weight;  // oneDNN-packed [out, in], or the [in, out] matrix of kinds 2 and 4
  std::optional<Tensor> bias;
  Int8 int8;
  std::shared_ptr<Int8Weight> own;
};

inline Tensor onednn_linear(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&,
                                     c10::string_view, c10::List<std::optional<at::Scalar>>,
                                     std::optional<c10::string_view>)>();
  return op.call(x, w, b, "none", c10::List<std::optional<at::Scalar>>(), std::string(""));
}

// The dynamically quantised product (FBGEMM's or oneDNN's, as the weight was packed), through
// the dispatcher as the PyTorch engine calls it (so that the profiler sees it too): 8-bit
// activations, the weights' width chosen when they were packed (model/packed.py)
inline Tensor int8_linear(const Tensor& x, const Int8& w) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("quantized::linear_dynamic", "")
                       .typed<Tensor(Tensor, const Int8&, bool)>();
  return op.call(x, w, false);
}

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
      return int8_linear(x, p.int8);
    case 3: {
      RECORD_FUNCTION("wtnmt::int8_product", std::vector<c10::IValue>({x}));  // (profilers)
      return int8_product(x, *p.own);
    }
    case 4:
      return p.bias ? at::addmm(*p.bias, x, p.weight) : at::mm(x, p.weight);
    default:
      return x.matmul(p.weight);
  }
}

}  // namespace wtnmt_native
