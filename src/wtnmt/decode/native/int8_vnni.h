// The VNNI builds of the native engine's own int8 product (int8.h): AVX512-VNNI and AVX-VNNI,
// each the activations' range and quantisation and the product in register tiles, the outputs
// dequantised in the tile, as int8_layout.h's portable build computes them.
#pragma once

#include "int8_layout.h"
#include "vectors.h"

namespace wtnmt_native {

// The register tiles: rows × blocks of 16 outputs. AVX512-VNNI: 4 × 4, 16 accumulators of 32
// zmm (on a Zen 4, one thread, int8_products.py, against FBGEMM's speed in the same rounds:
// 8-20 % faster than 4 × 2 shape by shape at 160 rows, -10 to +21 % at 32; the tile alone,
// 4 × 4 and 8 × 2 ran 5-9 % faster than 4 × 2, and 6 × 3, 6 × 4 and 8 × 3 gained no more on
// the whole); AVX-VNNI: 4 × 1, 8 accumulators of 16 ymm
constexpr int ROWS512 = 4, BLOCKS512 = 4, ROWS256 = 4;

// The smallest and largest of n floats, W at a time (vectors.h's vectors: one build for each
// instruction set, as the wrappers below are compiled)
template <int W>
WTNMT_INLINE void range_lanes(const float* x, int64_t n, float* lo, float* hi) {
  using V = typename Vec<W>::T;
  float l = x[0], h = x[0];
  int64_t i = 0;
  if (n >= W) {
    V a = load<W>(x), b = a;
    for (i = W; i + W <= n; i += W) {
      const V v = load<W>(x + i);
      a = v < a ? v : a;
      b = v > b ? v : b;
    }
    for (int j = 0; j < W; ++j) {
      l = std::min(l, a[j]);
      h = std::max(h, b[j]);
    }
  }
  for (; i < n; ++i) {
    l = std::min(l, x[i]);
    h = std::max(h, x[i]);
  }
  *lo = l;
  *hi = h;
}

#if defined(__x86_64__) && defined(__GNUC__)

#define WTNMT_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define WTNMT_AVX_VNNI __attribute__((target("avx2,fma,avxvnni")))

// acc += a (u8) · b (s8), four products a lane, in place. As inline assembly: through the
// intrinsics GCC 12 moved every accumulator to another register at each step of the loop
// (and one to the stack), and the tiles ran at half the speed (int8_products.py)
WTNMT_AVX512_VNNI inline __attribute__((always_inline)) void dpbusd(__m512i& acc, __m512i a,
                                                                    __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
}

WTNMT_AVX_VNNI inline __attribute__((always_inline)) void dpbusd(__m256i& acc, __m256i a,
                                                                 __m256i b) {
  asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
}

// One row's step of a tile: its next 4 activations (broadcast) by the weights' next group, in
// each of the tile's B blocks
template <int B>
WTNMT_AVX512_VNNI inline __attribute__((always_inline)) void row_avx512(
    const uint8_t* four, __m512i w0, __m512i w1, __m512i w2, __m512i w3, __m512i& c0, __m512i& c1,
    __m512i& c2, __m512i& c3) {
  int32_t x;
  std::memcpy(&x, four, 4);
  const __m512i xv = _mm512_set1_epi32(x);
  dpbusd(c0, xv, w0);
  if constexpr (B > 1) dpbusd(c1, xv, w1);
  if constexpr (B > 2) dpbusd(c2, xv, w2);
  if constexpr (B > 3) dpbusd(c3, xv, w3);
}

WTNMT_AVX_VNNI inline __attribute__((always_inline)) void row_avx2(const uint8_t* four, __m256i w0,
                                                                   __m256i w1, __m256i& c0,
                                                                   __m256i& c1) {
  int32_t x;
  std::memcpy(&x, four, 4);
  const __m256i xv = _mm256_set1_epi32(x);
  dpbusd(c0, xv, w0);
  dpbusd(c1, xv, w1);
}

WTNMT_AVX512_VNNI inline void range_avx512(const float* x, int64_t n, float* lo, float* hi) {
  range_lanes<16>(x, n, lo, hi);
}

WTNMT_AVX512_VNNI inline void quantize_avx512(const float* x, int64_t rows, int64_t in,
                                              int64_t width, Activations a, uint8_t* q) {
  const __m512 inverse = _mm512_set1_ps(1.f / a.scale);
  const __m512 zero = _mm512_set1_ps(static_cast<float>(a.zero));
  const __m512i top = _mm512_set1_epi32(255), bottom = _mm512_setzero_si512();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * in;
    uint8_t* qr = q + r * width;
    int64_t k = 0;
    for (; k + 16 <= in; k += 16) {
      __m512i v = _mm512_cvtps_epi32(_mm512_fmadd_ps(_mm512_loadu_ps(xr + k), inverse, zero));
      v = _mm512_min_epi32(_mm512_max_epi32(v, bottom), top);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + k), _mm512_cvtepi32_epi8(v));
    }
    quantize_portable(xr + k, 1, in - k, width - k, a, qr + k);  // (the tail and padding)
  }
}

// R rows × B blocks (16 outputs each) of the AVX512-VNNI build
template <int R, int B>
WTNMT_AVX512_VNNI inline void tile_avx512(const uint8_t* q, int64_t width, const Int8Weight& w,
                                          Activations a, int64_t b0, float* y) {
  // the accumulators as named variables (in an array, GCC kept them in memory): row r, block j
  const __m512i z = _mm512_setzero_si512();
  __m512i c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z, c20 = z,
          c21 = z, c22 = z, c23 = z, c30 = z, c31 = z, c32 = z, c33 = z;
  const int64_t stride = w.groups * 64;  // from one block's weights to the next's
  const int8_t* block = w.q.data() + b0 * stride;
  const uint8_t* q1 = q + (R > 1 ? width : 0);
  const uint8_t* q2 = q + (R > 2 ? 2 * width : 0);
  const uint8_t* q3 = q + (R > 3 ? 3 * width : 0);
  for (int64_t g = 0; g < w.groups; ++g) {
    const int8_t* here = block + g * 64;
    const __m512i w0 = _mm512_loadu_si512(here);
    const __m512i w1 = B > 1 ? _mm512_loadu_si512(here + stride) : w0;
    const __m512i w2 = B > 2 ? _mm512_loadu_si512(here + 2 * stride) : w0;
    const __m512i w3 = B > 3 ? _mm512_loadu_si512(here + 3 * stride) : w0;
    row_avx512<B>(q + g * 4, w0, w1, w2, w3, c00, c01, c02, c03);
    if constexpr (R > 1) row_avx512<B>(q1 + g * 4, w0, w1, w2, w3, c10, c11, c12, c13);
    if constexpr (R > 2) row_avx512<B>(q2 + g * 4, w0, w1, w2, w3, c20, c21, c22, c23);
    if constexpr (R > 3) row_avx512<B>(q3 + g * 4, w0, w1, w2, w3, c30, c31, c32, c33);
    // the weights held to the step's end: else GCC gave the last row's accumulators the
    // registers of weights just used up, and moved them back and forth at each step (a single
    // row's tile has no such moves, and loaded its weights twice for this)
    if constexpr (R > 1) asm("" : : "v"(w0), "v"(w1), "v"(w2), "v"(w3));
  }
  const __m512i acc[4][4] = {
      {c00, c01, c02, c03}, {c10, c11, c12, c13}, {c20, c21, c22, c23}, {c30, c31, c32, c33}};
  const __m512i zero = _mm512_set1_epi32(a.zero);
  const __m512 sx = _mm512_set1_ps(a.scale);
  for (int j = 0; j < B; ++j) {
    const int64_t n0 = (b0 + j) * 16;
    const __m512i sums = _mm512_mullo_epi32(zero, _mm512_loadu_si512(w.sums.data() + n0));
    const __m512 scale = _mm512_mul_ps(sx, _mm512_loadu_ps(w.scale.data() + n0));
    const __m512 bias = _mm512_loadu_ps(w.bias.data() + n0);
    const int64_t count = std::min<int64_t>(16, w.out - n0);
    const __mmask16 mask = count == 16 ? 0xffff : (1u << count) - 1;
    for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][j], sums));
      _mm512_mask_storeu_ps(y + r * w.out + n0, mask, _mm512_fmadd_ps(s, scale, bias));
    }
  }
}

template <int B>
WTNMT_AVX512_VNNI inline void rows_avx512(const uint8_t* q, int64_t rows, int64_t width,
                                          const Int8Weight& w, Activations a, int64_t b0,
                                          float* y) {
  int64_t r = 0;
  for (; r + ROWS512 <= rows; r += ROWS512)
    tile_avx512<ROWS512, B>(q + r * width, width, w, a, b0, y + r * w.out);
  const int64_t left = rows - r;
  q += r * width;
  y += r * w.out;
  switch (left) {
    case 3: return tile_avx512<3, B>(q, width, w, a, b0, y);
    case 2: return tile_avx512<2, B>(q, width, w, a, b0, y);
    case 1: return tile_avx512<1, B>(q, width, w, a, b0, y);
  }
}

WTNMT_AVX512_VNNI inline void product_avx512(const uint8_t* q, int64_t rows, int64_t width,
                                             const Int8Weight& w, Activations a, int64_t b0,
                                             int64_t b1, float* y) {
  int64_t b = b0;
  for (; b + BLOCKS512 <= b1; b += BLOCKS512) rows_avx512<BLOCKS512>(q, rows, width, w, a, b, y);
  switch (b1 - b) {  // the blocks left over (at most BLOCKS512 - 1)
    case 3: return rows_avx512<3>(q, rows, width, w, a, b, y);
    case 2: return rows_avx512<2>(q, rows, width, w, a, b, y);
    case 1: return rows_avx512<1>(q, rows, width, w, a, b, y);
  }
}

WTNMT_AVX_VNNI inline void range_avx2(const float* x, int64_t n, float* lo, float* hi) {
  range_lanes<8>(x, n, lo, hi);
}

WTNMT_AVX_VNNI inline void quantize_avx2(const float* x, int64_t rows, int64_t in, int64_t width,
                                         Activations a, uint8_t* q) {
  const __m256 inverse = _mm256_set1_ps(1.f / a.scale);
  const __m256 zero = _mm256_set1_ps(static_cast<float>(a.zero));
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * in;
    uint8_t* qr = q + r * width;
    int64_t k = 0;
    for (; k + 16 <= in; k += 16) {
      const __m256i v0 = _mm256_cvtps_epi32(_mm256_fmadd_ps(_mm256_loadu_ps(xr + k), inverse, zero));
      const __m256i v1 =
          _mm256_cvtps_epi32(_mm256_fmadd_ps(_mm256_loadu_ps(xr + k + 8), inverse, zero));
      // int32 → int16 → uint8, each saturating (so clamped to 0…255), lanes put back in order
      const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(v0, v1), 0xd8);
      const __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(words),
                                             _mm256_extracti128_si256(words, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + k), bytes);
    }
    quantize_portable(xr + k, 1, in - k, width - k, a, qr + k);
  }
}

// R rows × one block (16 outputs: two ymm) of the AVX-VNNI build
template <int R>
WTNMT_AVX_VNNI inline void tile_avx2(const uint8_t* q, int64_t width, const Int8Weight& w,
                                     Activations a, int64_t b0, float* y) {
  // the accumulators as named variables (in an array, GCC kept them in memory): row r, half j
  __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
          c30 = c00, c31 = c00;
  const int8_t* block = w.q.data() + b0 * w.groups * 64;
  const uint8_t* q1 = q + (R > 1 ? width : 0);
  const uint8_t* q2 = q + (R > 2 ? 2 * width : 0);
  const uint8_t* q3 = q + (R > 3 ? 3 * width : 0);
  for (int64_t g = 0; g < w.groups; ++g) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + g * 64));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + g * 64 + 32));
    row_avx2(q + g * 4, w0, w1, c00, c01);
    if constexpr (R > 1) row_avx2(q1 + g * 4, w0, w1, c10, c11);
    if constexpr (R > 2) row_avx2(q2 + g * 4, w0, w1, c20, c21);
    if constexpr (R > 3) row_avx2(q3 + g * 4, w0, w1, c30, c31);
  }
  const __m256i acc[4][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}};
  const __m256i zero = _mm256_set1_epi32(a.zero);
  const __m256 sx = _mm256_set1_ps(a.scale);
  const int64_t n0 = b0 * 16, count = std::min<int64_t>(16, w.out - n0);
  for (int j = 0; j < 2; ++j) {
    const int64_t n = n0 + 8 * j;
    const __m256i sums = _mm256_mullo_epi32(
        zero, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.sums.data() + n)));
    const __m256 scale = _mm256_mul_ps(sx, _mm256_loadu_ps(w.scale.data() + n));
    const __m256 bias = _mm256_loadu_ps(w.bias.data() + n);
    const int64_t here = std::min<int64_t>(8, count - 8 * j);
    if (here <= 0) break;
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(here)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int r = 0; r < R; ++r) {
      const __m256 s = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][j], sums));
      _mm256_maskstore_ps(y + r * w.out + n, mask, _mm256_fmadd_ps(s, scale, bias));
    }
  }
}

WTNMT_AVX_VNNI inline void product_avx2(const uint8_t* q, int64_t rows, int64_t width,
                                        const Int8Weight& w, Activations a, int64_t b0,
                                        int64_t b1, float* y) {
  for (int64_t b = b0; b < b1; ++b) {
    int64_t r = 0;
    for (; r + ROWS256 <= rows; r += ROWS256)
      tile_avx2<ROWS256>(q + r * width, width, w, a, b, y + r * w.out);
    const int64_t left = rows - r;
    const uint8_t* qr = q + r * width;
    float* yr = y + r * w.out;
    switch (left) {
      case 3: tile_avx2<3>(qr, width, w, a, b, yr); break;
      case 2: tile_avx2<2>(qr, width, w, a, b, yr); break;
      case 1: tile_avx2<1>(qr, width, w, a, b, yr); break;
    }
  }
}

#endif

}  // namespace wtnmt_native
