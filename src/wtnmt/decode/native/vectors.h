// How the native engine's own kernels (attention.h, search_ops.h) are vectorised: with GCC's
// vector extension, ``Vec<W>`` of W floats, each kernel a template on W compiled three times
// (WTNMT_KERNEL): for AVX-512 (W = 16: one zmm register), AVX2 with FMA (8: one ymm) and
// anything else (4: one xmm); which one runs is chosen once, from the CPU (kernel_width()).
// Left to itself GCC interchanged these kernels' loops and multiplied in scalars; vectors
// wider than the instruction set's (16 floats under AVX2: target_clones' way) went through the
// stack: timed alone, the branched cross-attention kernel took 1.27 ms in that AVX2 build,
// 0.09 ms in the AVX-512 one.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace wtnmt_native {

#define WTNMT_INLINE inline __attribute__((always_inline))

template <int W>
struct Vec {
  typedef float T __attribute__((vector_size(W * sizeof(float))));
};

template <int W>
WTNMT_INLINE typename Vec<W>::T load(const float* p) {
  typename Vec<W>::T v;
  std::memcpy(&v, p, sizeof v);  // (an unaligned vector load)
  return v;
}

template <int W>
WTNMT_INLINE void store(float* p, const typename Vec<W>::T& v) {
  std::memcpy(p, &v, sizeof v);
}

// The sum of a vector's lanes, pairwise (a fixed order: log2 W rounds of adds, not a chain)
template <int W>
WTNMT_INLINE float lane_sum(const typename Vec<W>::T& v) {
  float a[W];
  store<W>(a, v);
  for (int w = W / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) a[l] += a[l + w];
  return a[0];
}

// Asks for ``floats`` floats from ``p`` on into the cache (for the next item of a kernel: the
// buffers attention reads are too many short blocks for the hardware's prefetcher)
WTNMT_INLINE void prefetch(const float* p, int64_t floats) {
  for (int64_t i = 0; i < floats; i += 64 / sizeof(float)) __builtin_prefetch(p + i, 0, 3);
}

// The widest build of the kernels this CPU runs: 16 (AVX-512), 8 (AVX2 and FMA) or 4 floats
inline int cpu_kernel_width() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f")) return 16;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 8;
#endif
  return 4;
}

// Which build of the kernels runs: the widest the CPU has, no wider than ATEN_CPU_CAPABILITY
// allows (as PyTorch's own kernels); tests and benchmarks set another (``set_kernels``).
inline int& kernel_width() {
  static int width = [] {
    const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
    const std::string limit = cap ? cap : "";
    const int w = cpu_kernel_width();
    return limit == "default" ? 4 : limit == "avx2" && w > 8 ? 8 : w;
  }();
  return width;
}

// Defines ``name`` (returning ``ret``, taking ``params``) as ``name##_impl<W> args`` compiled
// for each instruction set, the one kernel_width() names called.
#if defined(__x86_64__) && defined(__GNUC__)
#define WTNMT_KERNEL(ret, name, params, args)                          \
  __attribute__((target("avx512f"))) static ret name##_avx512 params { \
    return name##_impl<16> args;                                       \
  }                                                                    \
  __attribute__((target("avx2,fma"))) static ret name##_avx2 params {  \
    return name##_impl<8> args;                                        \
  }                                                                    \
  static ret name##_portable params { return name##_impl<4> args; }    \
  static ret name params {                                             \
    const int width_ = kernel_width();                                 \
    return width_ == 16  ? name##_avx512 args                          \
           : width_ == 8 ? name##_avx2 args                            \
                         : name##_portable args;                       \
  }
#else
#define WTNMT_KERNEL(ret, name, params, args) \
  static ret name params { return name##_impl<4> args; }
#endif

}  // namespace wtnmt_native
