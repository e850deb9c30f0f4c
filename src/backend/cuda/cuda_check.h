#pragma once
// Every CUDA runtime call goes through EKVA_CUDA_CHECK, which turns a failure into ekva::Error
// naming the call, the file and the line.
#include <cuda_runtime_api.h>

#include <cstddef>

namespace ekva::cuda {

// Throws ekva::Error unless status is cudaSuccess.
void check(cudaError_t status, const char* call, const char* file, int line);

// Throws ekva::Error (invalid argument) naming `op` and `what` unless p is a multiple of `bytes`
// (the size of the vectors in which op's kernels access it).
void check_aligned(const void* p, size_t bytes, const char* op, const char* what);

// True when the runtime finds at least one CUDA device; tests skip otherwise.
bool device_available();

}  // namespace ekva::cuda

#define EKVA_CUDA_CHECK(call) ::ekva::cuda::check((call), #call, __FILE__, __LINE__)
