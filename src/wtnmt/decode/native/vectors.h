// How the native engine's own kernels (attention.h, search_ops.h) are vectorised: with GCC's
// vector extension (``Lanes``, 16 floats), compiled once per instruction set by target_clones
// (one zmm register a vector in the AVX-512 clone, two ymm in the AVX2 one, four xmm in the
// default one). Left to itself GCC interchanged these kernels' loops and multiplied in scalars.
#pragma once

#include <cstdint>
#include <cstring>

namespace wtnmt_native {

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
// one build for every x86-64 CPU: the loader picks the widest vectors the CPU has
#define WTNMT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define WTNMT_CLONES
#endif
#define WTNMT_INLINE inline __attribute__((always_inline))

constexpr int64_t kLanes = 16;  // floats a vector
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

WTNMT_INLINE Lanes load(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);  // (an unaligned vector load)
  return v;
}

WTNMT_INLINE void store(float* p, Lanes v) { std::memcpy(p, &v, sizeof v); }

// The sum of a vector's lanes, pairwise (a fixed order: 4 rounds of adds, not a chain of 15)
WTNMT_INLINE float lane_sum(Lanes v) {
  float a[kLanes];
  store(a, v);
  for (int64_t w = kLanes / 2; w > 0; w /= 2)
    for (int64_t l = 0; l < w; ++l) a[l] += a[l + w];
  return a[0];
}

// Asks for ``floats`` floats from ``p`` on into the cache (for the next item of a kernel: the
// buffers attention reads are too many short blocks for the hardware's prefetcher)
WTNMT_INLINE void prefetch(const float* p, int64_t floats) {
  for (int64_t i = 0; i < floats; i += 64 / sizeof(float)) __builtin_prefetch(p + i, 0, 3);
}

}  // namespace wtnmt_native
