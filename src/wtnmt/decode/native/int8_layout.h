// int8.h's weights, the activations' quantisation and the portable build (plain C++): what
// every build of the native engine's own int8 product shares (int8_vnni.h has the VNNI ones).
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace wtnmt_native {

using at::Tensor;

struct Int8Weight {
  int64_t out = 0, in = 0;    // the product's shape: [out, in]
  int64_t blocks = 0;         // of 16 outputs (the last padded with zero weights)
  int64_t groups = 0;         // of 4 inputs (the last padded with zero weights)
  std::vector<int8_t> q;      // [blocks][groups][16][4]
  std::vector<int32_t> sums;  // [blocks·16]: Σ_k q[n][k], for the zero point
  std::vector<float> scale;   // [blocks·16]: the weights' scale per output (0 in the padding)
  std::vector<float> bias;    // [blocks·16] (zeros where the product has none)
  int lanes = 0;              // the build that multiplies: 16, 8 or 0 (portable)
};

// The builds of the int8 kernel this CPU runs, widest first: 16 (AVX512-VNNI), 8 (AVX-VNNI;
// VEX-encoded, which a CPU with AVX512-VNNI alone lacks) and 0 (portable) everywhere
inline std::vector<int> int8_builds() {
  std::vector<int> builds;
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw"))
    builds.push_back(16);
  if (__builtin_cpu_supports("avxvnni")) builds.push_back(8);
#endif
  builds.push_back(0);
  return builds;
}

// Lays out q (int8 [out, in]) with its per-output scales and bias for int8_product.
inline Int8Weight int8_weight(const Tensor& q, const Tensor& scale,
                              const std::optional<Tensor>& bias, int lanes) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar, "int8 weights: int8 [out, in]");
  TORCH_CHECK(lanes == 0 || lanes == 8 || lanes == 16, "int8 kernels: 0, 8 or 16 lanes");
  const std::vector<int> builds = int8_builds();
  TORCH_CHECK(std::find(builds.begin(), builds.end(), lanes) != builds.end(),
              "int8 kernels: this CPU has no ", lanes == 8 ? "AVX-VNNI" : "AVX512-VNNI");
  Int8Weight w;
  w.out = q.size(0);
  w.in = q.size(1);
  w.blocks = (w.out + 15) / 16;
  w.groups = (w.in + 3) / 4;
  w.lanes = lanes;
  const Tensor qc = q.contiguous();
  const Tensor sc = scale.to(at::kFloat).contiguous();
  TORCH_CHECK(sc.numel() == w.out, "int8 weights: one scale an output");
  const int8_t* src = qc.data_ptr<int8_t>();
  w.q.assign(w.blocks * w.groups * 64, 0);
  w.sums.assign(w.blocks * 16, 0);
  w.scale.assign(w.blocks * 16, 0.f);
  w.bias.assign(w.blocks * 16, 0.f);
  for (int64_t n = 0; n < w.out; ++n) {
    int8_t* block = w.q.data() + (n / 16) * w.groups * 64 + (n % 16) * 4;
    int32_t sum = 0;
    for (int64_t k = 0; k < w.in; ++k) {
      const int8_t v = src[n * w.in + k];
      block[(k / 4) * 64 + k % 4] = v;
      sum += v;
    }
    w.sums[n] = sum;
    w.scale[n] = sc.data_ptr<float>()[n];
  }
  if (bias) {
    const Tensor b = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(b.numel() == w.out, "int8 weights: one bias an output");
    std::memcpy(w.bias.data(), b.data_ptr<float>(), w.out * sizeof(float));
  }
  return w;
}

// The activations' quantisation (ATen's ChooseQuantizationParams over 0…255, without its
// reduced range or preserved sparsity)
struct Activations {
  float scale = 1.f;
  int32_t zero = 0;
};

inline Activations choose_activations(float lo, float hi) {
  lo = std::min(lo, 0.f);
  hi = std::max(hi, 0.f);
  double scale = (static_cast<double>(hi) - lo) / 255.0;
  if (static_cast<float>(scale) == 0.f || std::isinf(1.f / static_cast<float>(scale))) scale = 0.1;
  const double from_min = -lo / scale, from_max = 255.0 - hi / scale;
  const double min_error = -std::abs(lo / scale), max_error = 255.0 - std::abs(hi / scale);
  const double zero = min_error < max_error ? from_min : from_max;
  Activations a;
  a.scale = static_cast<float>(scale);
  a.zero = zero < 0 ? 0 : zero > 255 ? 255 : static_cast<int32_t>(std::nearbyint(zero));
  return a;
}

// x [rows, in] → u8 [rows, groups·4] (the padding 0), for the range [lo, hi]
inline void quantize_portable(const float* x, int64_t rows, int64_t in, int64_t width,
                              Activations a, uint8_t* q) {
  const float inverse = 1.f / a.scale;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < in; ++k) {
      const float v = std::nearbyint(std::fma(x[r * in + k], inverse, static_cast<float>(a.zero)));
      q[r * width + k] = static_cast<uint8_t>(v < 0.f ? 0.f : v > 255.f ? 255.f : v);
    }
    std::memset(q + r * width + in, 0, width - in);
  }
}

inline void range_portable(const float* x, int64_t n, float* lo, float* hi) {
  float a = x[0], b = x[0];
  for (int64_t i = 1; i < n; ++i) {
    a = std::min(a, x[i]);
    b = std::max(b, x[i]);
  }
  *lo = a;
  *hi = b;
}

// y[r, n] for the outputs [n0, n0 + count) of one block from its int32 sums
inline void dequantize(const int32_t* sums, int64_t rows, int64_t stride, const Int8Weight& w,
                       Activations a, int64_t n0, int64_t count, float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < count; ++j) {
      const int64_t n = n0 + j;
      const int32_t s = sums[r * stride + j] - a.zero * w.sums[n];
      y[r * ldy + n] = std::fma(static_cast<float>(s), a.scale * w.scale[n], w.bias[n]);
    }
}

inline void product_portable(const uint8_t* q, int64_t rows, int64_t width, const Int8Weight& w,
                             Activations a, int64_t b0, int64_t b1, float* y) {
  std::vector<int32_t> sums(rows * 16);
  for (int64_t b = b0; b < b1; ++b) {
    const int8_t* block = w.q.data() + b * w.groups * 64;
    std::fill(sums.begin(), sums.end(), 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < w.groups; ++g)
        for (int j = 0; j < 16; ++j)
          for (int i = 0; i < 4; ++i)
            sums[r * 16 + j] += int32_t(q[r * width + g * 4 + i]) * block[g * 64 + j * 4 + i];
    dequantize(sums.data(), rows, 16, w, a, b * 16, std::min<int64_t>(16, w.out - b * 16), y,
               w.out);
  }
}

}  // namespace wtnmt_native
