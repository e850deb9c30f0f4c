#include "cli/device_args.h"

#include "core/error.h"
#ifdef EKVA_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#endif

namespace ekva::cli {

void add_device_option(CLI::App* cmd, DeviceArgs& args) {
  cmd->add_option("--device", args.device,
                  "Where the model runs: cpu, cuda, or auto (the GPU when one is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
}

#ifdef EKVA_WITH_CUDA
std::string use_device(const DeviceArgs& args, const std::string& kv_dtype,
                       EngineOptions& options) {
  const bool gpu = cuda::device_available();
  if (args.device == "cuda" && !gpu) {
    fail(ErrorKind::kUnsupported, "--device cuda: no CUDA device is present");
  }
  if (args.device == "cpu" || !gpu) return "cpu";
  options.backend = cuda::cuda_backend_factory();
  options.device = "cuda";
  if (kv_dtype.empty()) options.kv.dtype = DType::kBF16;
  return "cuda";
}
#else
std::string use_device(const DeviceArgs& args, const std::string& /*kv_dtype*/,
                       EngineOptions& /*options*/) {
  if (args.device == "cuda") {
    fail(ErrorKind::kUnsupported,
         "--device cuda: this ekva was built without the CUDA backend (configure with "
         "-DEKVA_CUDA=ON where nvcc is installed)");
  }
  return "cpu";
}
#endif

}  // namespace ekva::cli
