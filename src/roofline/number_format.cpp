#include "roofline/number_format.h"

#include "core/error.h"

namespace ekva {

std::string_view number_format_name(NumberFormat format) {
  switch (format) {
    case NumberFormat::kF32:
      return "f32";
    case NumberFormat::kF16:
      return "f16";
    case NumberFormat::kBF16:
      return "bf16";
    case NumberFormat::kFP8:
      return "fp8";
    case NumberFormat::kINT8:
      return "int8";
    case NumberFormat::kINT4:
      return "int4";
  }
  return "?";
}

std::string_view peak_format_name(PeakFormat format) {
  switch (format) {
    case PeakFormat::kFP32:
      return "fp32";
    case PeakFormat::kTF32:
      return "tf32";
    case PeakFormat::kBF16:
      return "bf16";
    case PeakFormat::kFP8:
      return "fp8";
    case PeakFormat::kINT8:
      return "int8";
  }
  return "?";
}

double number_format_bytes(NumberFormat format) {
  switch (format) {
    case NumberFormat::kF32:
      return 4;
    case NumberFormat::kF16:
    case NumberFormat::kBF16:
      return 2;
    case NumberFormat::kFP8:
    case NumberFormat::kINT8:
      return 1;
    case NumberFormat::kINT4:
      return 0.5;
  }
  return 0;
}

NumberFormat parse_number_format(std::string_view name, std::string_view what) {
  for (NumberFormat f : {NumberFormat::kF32, NumberFormat::kF16, NumberFormat::kBF16,
                         NumberFormat::kFP8, NumberFormat::kINT8, NumberFormat::kINT4}) {
    if (name == number_format_name(f)) return f;
  }
  if (name == "float32" || name == "fp32") return NumberFormat::kF32;
  if (name == "bfloat16") return NumberFormat::kBF16;
  if (name == "float16" || name == "fp16") return NumberFormat::kF16;
  fail(ErrorKind::kInvalidArgument,
       "{}: unknown number format '{}' (f32, f16, bf16, fp8, int8, int4)", what, name);
}

PeakFormat gemm_peak_format(NumberFormat format) {
  switch (format) {
    case NumberFormat::kF32:
      return PeakFormat::kFP32;
    case NumberFormat::kFP8:
      return PeakFormat::kFP8;
    case NumberFormat::kINT8:
      return PeakFormat::kINT8;
    case NumberFormat::kF16:
    case NumberFormat::kBF16:
    case NumberFormat::kINT4:
      return PeakFormat::kBF16;
  }
  return PeakFormat::kBF16;
}

}  // namespace ekva
