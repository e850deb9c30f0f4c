#include "backend/cuda/cuda_check.h"

#include <cstdint>

#include "core/error.h"

namespace ekva::cuda {
namespace {

ErrorKind error_kind(cudaError_t status) {
  switch (status) {
    case cudaErrorMemoryAllocation:
      return ErrorKind::kOutOfMemory;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevice:
      return ErrorKind::kInvalidArgument;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return ErrorKind::kUnsupported;
    default:
      // The device or its driver refused or failed the operation.
      return ErrorKind::kIo;
  }
}

}  // namespace

void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  fail(error_kind(status), "CUDA error at {}:{}: {} failed: {} ({})", file, line, call,
       cudaGetErrorString(status), cudaGetErrorName(status));
}

void check_aligned(const void* p, size_t bytes, const char* op, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0) {
    fail(ErrorKind::kInvalidArgument, "{}: {} must be {}-byte aligned (got {})", op, what, bytes,
         fmt::ptr(p));
  }
}

bool device_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" status so later checks start clean
    return false;
  }
  return count > 0;
}

}  // namespace ekva::cuda
