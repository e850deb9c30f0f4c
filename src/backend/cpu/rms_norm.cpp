#include <cmath>

#include "backend/cpu/ops.h"

namespace ekva::cpu {

void rms_norm(const float* x, float* out, int n, int dim, const float* weight, double eps) {
  for (int t = 0; t < n; ++t) {
    const float* xr = x + static_cast<size_t>(t) * dim;
    float* yr = out + static_cast<size_t>(t) * dim;
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

void rms_norm(float* x, int n, int dim, const float* weight, double eps) {
  rms_norm(x, x, n, dim, weight, eps);
}

void silu_mul(const float* gate, const float* up, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace ekva::cpu
