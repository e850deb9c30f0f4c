#include "backend/cuda/gemm.h"

#include "backend/cuda/model_ops.h"
#include "core/error.h"

namespace ekva::cuda {
namespace {

void check_cublas(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail(status == CUBLAS_STATUS_ALLOC_FAILED ? ErrorKind::kOutOfMemory : ErrorKind::kIo,
       "cuBLAS: {} failed: {}", call, cublasGetStatusString(status));
}

// What cuBLAS's documentation asks of a workspace on Hopper.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

}  // namespace

Gemm::Gemm(cudaStream_t stream) : stream_(stream) {
  check_cublas(cublasCreate(&handle_), "cublasCreate");
  check_cublas(cublasSetStream(handle_, stream), "cublasSetStream");
  // After cublasSetStream, which resets the workspace to the library's own.
  workspace_ = DeviceBuffer<uint8_t>(kWorkspaceBytes);
  check_cublas(cublasSetWorkspace(handle_, workspace_.data(), workspace_.bytes()),
               "cublasSetWorkspace");
}

Gemm::~Gemm() {
  cublasDestroy(handle_);
}

// cuBLAS is column-major: the row-major y [n, out] is the column-major yᵀ [out, n] = W·xᵀ, where
// the row-major W [out, in] is the column-major Wᵀ and x [n, in] the column-major xᵀ.
void Gemm::bf16(const uint16_t* x, int n, const uint16_t* w, int out, int in, float* y) {
  if (n == 0) return;
  if (skinny_gemm_supported(n, in)) {
    skinny_gemm(x, n, w, out, in, y, stream_);
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  check_cublas(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w, CUDA_R_16BF, in,
                            x, CUDA_R_16BF, in, &zero, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (bf16)");
}

void Gemm::bf16_qkv(const uint16_t* x, int n, const uint16_t* w, int q_rows, int kv_rows, int in,
                    float* y) {
  if (n == 0) return;
  if (skinny_gemm_supported(n, in)) {
    skinny_gemm_blocks(x, n, w, q_rows, kv_rows, q_rows + 2 * kv_rows, in, y, stream_);
    return;
  }
  const size_t rows[3] = {static_cast<size_t>(q_rows), static_cast<size_t>(kv_rows),
                          static_cast<size_t>(kv_rows)};
  for (const size_t r : rows) {
    bf16(x, n, w, static_cast<int>(r), in, y);
    w += r * in;
    y += r * n;
  }
}

void Gemm::f32(const float* x, int n, const float* w, int out, int in, float* y) {
  if (n == 0) return;
  const float one = 1.0f, zero = 0.0f;
  // TF32 products keep 10 of float32's 23 mantissa bits, three more than the bf16 router of the
  // reference models, and run on the tensor cores where float32's run on the FMA pipes.
  check_cublas(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w, CUDA_R_32F, in,
                            x, CUDA_R_32F, in, &zero, y, CUDA_R_32F, out,
                            CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (tf32)");
}

}  // namespace ekva::cuda
