#pragma once
// Every CUDA runtime call goes through EKVA_CUDA_CHECK, which turns a failure into ekva::Error
// naming the call, the file and the line.
#include <cuda_runtime_api.h>

namespace ekva::cuda {

// Throws ekva::Error unless status is cudaSuccess.
void check(cudaError_t status, const char* call, const char* file, int line);

// True when the runtime finds at least one CUDA device; tests skip otherwise.
bool device_available();

}  // namespace ekva::cuda

#define EKVA_CUDA_CHECK(call) ::ekva::cuda::check((call), #call, __FILE__, __LINE__)
