#pragma once
// The one place where runtime attention shapes become template parameters.
#include <type_traits>

namespace ekva::cuda {

[[noreturn]] void fail_unsupported_decode_shape(int head_dim, int group);
[[noreturn]] void fail_unsupported_head_dim(int head_dim);
[[noreturn]] void fail_unsupported_prefill_head_dim(int head_dim);

// Calls f(std::integral_constant<int, head_dim>, std::integral_constant<int, group>) for head_dim
// 32, 64 or 128 and GQA group 1, 2, 4 or 8; throws ekva::Error (kUnsupported) for anything else.
template <typename F>
void dispatch_decode_shape(int head_dim, int group, F&& f) {
  const auto with_group = [&](auto dim) {
    switch (group) {
      case 1:
        return f(dim, std::integral_constant<int, 1>{});
      case 2:
        return f(dim, std::integral_constant<int, 2>{});
      case 4:
        return f(dim, std::integral_constant<int, 4>{});
      case 8:
        return f(dim, std::integral_constant<int, 8>{});
      default:
        fail_unsupported_decode_shape(head_dim, group);
    }
  };
  switch (head_dim) {
    case 32:
      return with_group(std::integral_constant<int, 32>{});
    case 64:
      return with_group(std::integral_constant<int, 64>{});
    case 128:
      return with_group(std::integral_constant<int, 128>{});
    default:
      fail_unsupported_decode_shape(head_dim, group);
  }
}

// Calls f(std::integral_constant<int, dims_per_lane>) with the head dimensions one lane of a warp
// owns when a warp spans a head (1, 2, 4 or 8: head_dim up to 256, a multiple of 2); throws
// ekva::Error (kUnsupported) for anything else.
template <typename F>
void dispatch_dims_per_lane(int head_dim, F&& f) {
  if (head_dim < 2 || head_dim % 2 != 0) fail_unsupported_head_dim(head_dim);
  if (head_dim <= 32) return f(std::integral_constant<int, 1>{});
  if (head_dim <= 64) return f(std::integral_constant<int, 2>{});
  if (head_dim <= 128) return f(std::integral_constant<int, 4>{});
  if (head_dim <= 256) return f(std::integral_constant<int, 8>{});
  fail_unsupported_head_dim(head_dim);
}

// Calls f(std::integral_constant<int, head_dim>) for the head sizes the tensor-core prefill
// attention is built for (32, 64 and 128); throws ekva::Error (kUnsupported) for anything else.
template <typename F>
void dispatch_prefill_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 32:
      return f(std::integral_constant<int, 32>{});
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    default:
      fail_unsupported_prefill_head_dim(head_dim);
  }
}

}  // namespace ekva::cuda
