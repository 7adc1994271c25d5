// The native engine's own int8 product (products.h's kind 3), where the CPU adds u8×s8
// products in 32 bits (VNNI): the same dynamic quantisation as PyTorch's
// quantized::linear_dynamic on the same packed weights (model/packed.py), in one pass and
// without its dispatch, activation packing and library calls. Activations per call, per
// tensor: the range [min(x, 0), max(x, 0)] onto 0…255 with a zero point, chosen as ATen's
// ChooseQuantizationParams chooses it and rounded as FBGEMM's quantiser rounds (x·(1/s) + z,
// one fused multiply-add, to nearest even); the weights' int8 values and per-channel scales
// as the library packed them; int32 sums (vpdpbusd: 4 products a lane, no 16-bit pair sums,
// so 8-bit weights cannot saturate); y = s_x·s_w·(Σ − z·Σ_k q_w) + b, as FBGEMM dequantises.
//
// Three builds: AVX512-VNNI (16 int32 lanes), AVX-VNNI (8; VEX-encoded, on CPUs without
// AVX-512 such as Intel's E-core Xeons) and a portable one in plain C++ (slow: for tests, and
// for CPUs without VNNI, which keep the library's product). The weights are laid out once for
// all three: blocks of 16 outputs, in each 4 inputs × 16 outputs per 64 bytes (one zmm, two
// ymm), so that one broadcast group of 4 activations multiplies 16 outputs a vpdpbusd.
#pragma once

#include "int8_vnni.h"

namespace wtnmt_native {

// x [rows, in] (float32) · Wᵀ + b through the dynamic int8 quantisation, on w's build
inline Tensor int8_product(const Tensor& input, const Int8Weight& w) {
  const Tensor x = input.contiguous();
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.in && x.scalar_type() == at::kFloat,
              "int8 product: float32 [rows, ", w.in, "]");
  const int64_t rows = x.size(0), width = w.groups * 4;
  Tensor y = at::empty({rows, w.out}, x.options());
  if (rows == 0) return y;
  const float* xp = x.data_ptr<float>();
  thread_local std::vector<uint8_t> buffer;
  buffer.resize(rows * width);
  uint8_t* q = buffer.data();
  float lo, hi;
  Activations a;
#if defined(__x86_64__) && defined(__GNUC__)
  if (w.lanes == 16) {
    range_avx512(xp, rows * w.in, &lo, &hi);
    a = choose_activations(lo, hi);
    quantize_avx512(xp, rows, w.in, width, a, q);
  } else if (w.lanes == 8) {
    range_avx2(xp, rows * w.in, &lo, &hi);
    a = choose_activations(lo, hi);
    quantize_avx2(xp, rows, w.in, width, a, q);
  } else
#endif
  {
    range_portable(xp, rows * w.in, &lo, &hi);
    a = choose_activations(lo, hi);
    quantize_portable(xp, rows, w.in, width, a, q);
  }
  // blocks shared among the threads, as many at a time as the AVX512-VNNI tile takes (pairs on
  // the others), and the rows too, in spans of whole tiles, where there are fewer such units
  // than threads (a product as narrow as d_model on a many-core server); one thread where an
  // item is under ~256k multiply-adds (a parallel region's start costs more). Every output is
  // computed alike however the work is split
  const int64_t unit = w.lanes == 16 ? BLOCKS512 : 2;
  const int64_t units = (w.blocks + unit - 1) / unit;
  const int64_t threads = at::get_num_threads();
  int64_t chunks = units < threads ? std::min((rows + 3) / 4, (threads + units - 1) / units) : 1;
  const int64_t span = ((rows + chunks - 1) / chunks + 3) / 4 * 4;  // rows an item takes
  chunks = (rows + span - 1) / span;
  const int64_t grain =
      std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(1, span * w.in * 16 * unit));
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, units * chunks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end;) {  // item i: rows of span i / units, blocks of unit i % units
      const int64_t c = i / units, u0 = i % units, u1 = std::min(units, u0 + end - i);
      const int64_t r0 = c * span, here = std::min(rows, r0 + span) - r0;
      const int64_t b0 = u0 * unit, b1 = std::min(u1 * unit, w.blocks);
      const uint8_t* qc = q + r0 * width;
      float* yc = yp + r0 * w.out;
      i += u1 - u0;
#if defined(__x86_64__) && defined(__GNUC__)
      if (w.lanes == 16) {
        product_avx512(qc, here, width, w, a, b0, b1, yc);
        continue;
      }
      if (w.lanes == 8) {
        product_avx2(qc, here, width, w, a, b0, b1, yc);
        continue;
      }
#endif
      product_portable(qc, here, width, w, a, b0, b1, yc);
    }
  });
  return y;
}

}  // namespace wtnmt_native
