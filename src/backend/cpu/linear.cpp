#include <cblas.h>

#include <cstring>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define EKVA_AVX2 1
#endif

namespace ekva::cpu {
namespace {

#ifdef EKVA_AVX2
inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const uint16_t* p, DType dtype) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (dtype == DType::kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

inline float load1(const void* row, int i, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(row)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(row)[i]);
    default:
      return f16_to_f32(static_cast<const uint16_t*>(row)[i]);
  }
}

// acc[t] = dot(x[t], row) for t < n (n <= kStreamedRows).
void row_dots(const WeightMatrix& w, int r, const float* x, int n, float* acc) {
  const int k = w.cols;
  const char* row =
      static_cast<const char*>(w.data) + static_cast<size_t>(r) * k * dtype_size(w.dtype);
  int i = 0;
#ifdef EKVA_AVX2
  auto load_w = [&](int at) {
    return w.dtype == DType::kF32 ? load8(reinterpret_cast<const float*>(row) + at)
                                  : load8(reinterpret_cast<const uint16_t*>(row) + at, w.dtype);
  };
  if (n == 1) {
    // Four independent chains hide the FMA latency; one chain would cap a core at ~4 bytes/cycle.
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (; i + 32 <= k; i += 32) {
      s0 = _mm256_fmadd_ps(load_w(i), load8(x + i), s0);
      s1 = _mm256_fmadd_ps(load_w(i + 8), load8(x + i + 8), s1);
      s2 = _mm256_fmadd_ps(load_w(i + 16), load8(x + i + 16), s2);
      s3 = _mm256_fmadd_ps(load_w(i + 24), load8(x + i + 24), s3);
    }
    for (; i + 8 <= k; i += 8) s0 = _mm256_fmadd_ps(load_w(i), load8(x + i), s0);
    acc[0] = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  } else {
    __m256 s[kStreamedRows];
    for (int t = 0; t < n; ++t) s[t] = _mm256_setzero_ps();
    for (; i + 8 <= k; i += 8) {
      const __m256 wv = load_w(i);
      for (int t = 0; t < n; ++t)
        s[t] = _mm256_fmadd_ps(wv, load8(x + static_cast<size_t>(t) * k + i), s[t]);
    }
    for (int t = 0; t < n; ++t) acc[t] = hsum(s[t]);
  }
#else
  for (int t = 0; t < n; ++t) acc[t] = 0.0f;
#endif
  for (; i < k; ++i) {
    const float wv = load1(row, i, w.dtype);
    for (int t = 0; t < n; ++t) acc[t] += wv * x[static_cast<size_t>(t) * k + i];
  }
}

}  // namespace

void linear(std::span<const Product> products) {
  std::vector<const Product*> streamed;
  int streamed_rows = 0;
  for (const Product& p : products) {
    if (p.n <= 0) continue;
    if (p.n <= kStreamedRows) {
      streamed.push_back(&p);
      streamed_rows += p.w->rows;
      continue;
    }
    const WeightMatrix& w = *p.w;
    const float* wf = static_cast<const float*>(w.data);
    std::vector<float> converted;
    if (w.dtype != DType::kF32) {
      converted.resize(static_cast<size_t>(w.rows) * w.cols);
      const size_t row_bytes = static_cast<size_t>(w.cols) * dtype_size(w.dtype);
#pragma omp parallel for schedule(static)
      for (int r = 0; r < w.rows; ++r) {
        to_f32(w.dtype, static_cast<const char*>(w.data) + r * row_bytes,
               converted.data() + static_cast<size_t>(r) * w.cols, w.cols);
      }
      wf = converted.data();
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, p.n, w.rows, w.cols, 1.0f, p.x, w.cols, wf,
                w.cols, 0.0f, p.y, w.rows);
    if (p.bias != nullptr) {
      for (int t = 0; t < p.n; ++t) {
        float* yr = p.y + static_cast<size_t>(t) * w.rows;
        for (int r = 0; r < w.rows; ++r) yr[r] += p.bias[r];
      }
    }
  }
  if (streamed.empty()) return;
#pragma omp parallel for schedule(static)
  for (int at = 0; at < streamed_rows; ++at) {
    size_t i = 0;
    int r = at;
    while (r >= streamed[i]->w->rows) r -= streamed[i++]->w->rows;
    const Product& p = *streamed[i];
    float acc[kStreamedRows];
    row_dots(*p.w, r, p.x, p.n, acc);
    const float b = p.bias != nullptr ? p.bias[r] : 0.0f;
    for (int t = 0; t < p.n; ++t) p.y[static_cast<size_t>(t) * p.w->rows + r] = acc[t] + b;
  }
}

void linear(const WeightMatrix& w, const float* x, int n, float* y, const float* bias) {
  const Product product{&w, x, n, y, bias};
  linear(std::span<const Product>(&product, 1));
}

void matrix_row(const WeightMatrix& w, int r, float* out) {
  const size_t row_bytes = static_cast<size_t>(w.cols) * dtype_size(w.dtype);
  to_f32(w.dtype, static_cast<const char*>(w.data) + r * row_bytes, out, w.cols);
}

}  // namespace ekva::cpu
