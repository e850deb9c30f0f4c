#pragma once
// Storage formats of weights, activations and KV entries, as the roofline counts them: bytes per
// element (int4 packs two per byte) and which peak of a device computes with them.
#include <string_view>

namespace ekva {

enum class NumberFormat { kF32, kF16, kBF16, kFP8, kINT8, kINT4 };

// The dense tensor-core (or vector) peaks a hardware file lists.
enum class PeakFormat { kFP32, kTF32, kBF16, kFP8, kINT8 };
inline constexpr int kNumPeakFormats = 5;

std::string_view number_format_name(NumberFormat format);
std::string_view peak_format_name(PeakFormat format);
double number_format_bytes(NumberFormat format);
// Throws kInvalidArgument naming `what` (an option or field) when `name` is not a known format.
NumberFormat parse_number_format(std::string_view name, std::string_view what);
// The peak a GEMM over operands of `format` runs at: f16 and bf16 share the bf16 peak; int4 weights
// are dequantised to bf16 in the kernel, as weight-only int4 kernels (Marlin, AWQ) do.
PeakFormat gemm_peak_format(NumberFormat format);

}  // namespace ekva
