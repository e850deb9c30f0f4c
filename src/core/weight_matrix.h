#pragma once
// A row-major weight matrix [rows = out features, cols = in features] in its stored dtype, viewed
// in place (in a mapped checkpoint or a backend's buffer). The neutral form in which a model's
// weights reach every backend.
#include <cstddef>

#include "core/dtype.h"

namespace ekva {

struct WeightMatrix {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int rows = 0;
  int cols = 0;
  size_t bytes() const { return static_cast<size_t>(rows) * cols * dtype_size(dtype); }
};

}  // namespace ekva
