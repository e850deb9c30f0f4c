#pragma once
// The one place where runtime attention shapes become template parameters.
#include <type_traits>

namespace ekva::cuda {

[[noreturn]] void fail_unsupported_decode_shape(int head_dim, int group);

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

}  // namespace ekva::cuda
