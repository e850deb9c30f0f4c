#pragma once
// Dense products: y[n, out] = x[n, in] · Wᵀ for a row-major weight W [out, in], as cpu::linear
// computes them; through cuBLAS, but bf16 products of few rows (decode) through skinny_gemm.
// Internal to src/backend/cuda.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/device_buffer.h"

namespace ekva::cuda {

class Gemm {
 public:
  explicit Gemm(cudaStream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // bf16 x and W, float32 accumulation and y.
  void bf16(const uint16_t* x, int n, const uint16_t* w, int out, int in, float* y);
  // The same for W = [Wq; Wk; Wv] (q_rows, kv_rows and kv_rows rows): y holds q [n, q_rows], then
  // k and v [n, kv_rows] each. One product for decode-sized n, three through cuBLAS.
  void bf16_qkv(const uint16_t* x, int n, const uint16_t* w, int q_rows, int kv_rows, int in,
                float* y);
  // float32 x, W and y, the products in TF32 (a prompt's router and shared-expert gate: the CUDA
  // engine tests hold the router logits to the CPU's within their bound).
  void f32(const float* x, int n, const float* w, int out, int in, float* y);

 private:
  cublasHandle_t handle_ = nullptr;
  // cuBLAS's workspace, owned here: without one it allocates a new workspace for every CUDA graph
  // a product is captured into.
  DeviceBuffer<uint8_t> workspace_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace ekva::cuda
