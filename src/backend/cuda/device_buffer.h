#pragma once
// Owning, move-only arrays in device memory and in page-locked host memory.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"

namespace ekva::cuda {

// Where an array lives: device memory, or page-locked host memory (copies between it and the device
// run at the bus's rate and stay asynchronous, where pageable memory goes through the driver's
// staging at a fraction of it).
struct DeviceAllocation {
  static void allocate(void** data, size_t bytes) { EKVA_CUDA_CHECK(cudaMalloc(data, bytes)); }
  static void release(void* data) { cudaFree(data); }
};
struct PinnedAllocation {
  static void allocate(void** data, size_t bytes) { EKVA_CUDA_CHECK(cudaMallocHost(data, bytes)); }
  static void release(void* data) { cudaFreeHost(data); }
};

template <typename T, typename Allocation>
class CudaArray {
 public:
  CudaArray() = default;
  explicit CudaArray(size_t count) : count_(count) {
    if (count > 0) Allocation::allocate(reinterpret_cast<void**>(&data_), bytes());
  }
  CudaArray(CudaArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  CudaArray& operator=(CudaArray&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    return *this;
  }
  CudaArray(const CudaArray&) = delete;
  CudaArray& operator=(const CudaArray&) = delete;
  ~CudaArray() {
    if (data_ != nullptr)
      Allocation::release(data_);  // a destructor cannot throw; a failure is sticky
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

template <typename T>
using PinnedBuffer = CudaArray<T, PinnedAllocation>;

template <typename T>
class DeviceBuffer : public CudaArray<T, DeviceAllocation> {
 public:
  using CudaArray<T, DeviceAllocation>::CudaArray;
  explicit DeviceBuffer(std::span<const T> host) : DeviceBuffer(host.size()) { upload(host); }

  void upload(std::span<const T> host) {
    if (host.size() != this->size()) {
      EKVA_CUDA_CHECK(cudaErrorInvalidValue);
    }
    if (this->size() > 0) {
      EKVA_CUDA_CHECK(cudaMemcpy(this->data(), host.data(), this->bytes(), cudaMemcpyHostToDevice));
    }
  }
  std::vector<T> download() const {
    std::vector<T> host(this->size());
    if (this->size() > 0) {
      EKVA_CUDA_CHECK(cudaMemcpy(host.data(), this->data(), this->bytes(), cudaMemcpyDeviceToHost));
    }
    return host;
  }
};

}  // namespace ekva::cuda
