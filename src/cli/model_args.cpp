#include "cli/model_args.h"

#include <chrono>
#include <filesystem>

#include "core/error.h"
#include "io/model_config.h"
#ifdef EKVA_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#endif

namespace ekva::cli {

void add_model_options(CLI::App* cmd, ModelArgs& args, const std::string& model_help) {
  cmd->add_option("--model", args.model, model_help)->required();
  cmd->add_option("--random-weights", args.random_seed,
                  "Seeded random bf16 weights of --model's shape, made on the GPU, instead of the "
                  "checkpoint's (--model may then be a config.json alone)");
}

std::string model_name(const std::string& model) {
  std::filesystem::path p = std::filesystem::path(model).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // a directory given with a trailing slash
  std::error_code ec;
  if (std::filesystem::is_regular_file(p, ec)) p = p.parent_path();  // a config.json
  return p.filename().string();
}

#ifdef EKVA_WITH_CUDA

DeviceWeights weights_on_device(const ModelArgs& args, size_t reserve_bytes) {
  if (!cuda::device_available()) {
    fail(ErrorKind::kUnsupported, "{}: no CUDA device is present to hold the weights", args.model);
  }
  DeviceWeights w;
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<const cuda::DeviceModel> weights;
  if (args.random_seed) {
    const ModelSpec spec = load_model_config(args.model);
    weights = std::make_shared<const cuda::DeviceModel>(spec, *args.random_seed, reserve_bytes,
                                                        args.model);
    w.model = Model::without_weights(spec, args.model);
    w.random = true;
  } else {
    w.model = Model::load(args.model);
    weights = std::make_shared<const cuda::DeviceModel>(*w.model, reserve_bytes);
  }
  w.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  w.bytes = weights->bytes();
  w.backend = cuda::cuda_backend_factory(std::move(weights));
  return w;
}

#else

DeviceWeights weights_on_device(const ModelArgs& args, size_t /*reserve_bytes*/) {
  fail(ErrorKind::kUnsupported,
       "{}: this ekva was built without the CUDA backend, so it cannot put weights on a GPU "
       "(configure with -DEKVA_CUDA=ON where nvcc is installed)",
       args.model);
}

#endif

void add_sampling_options(CLI::App* cmd, SamplingOptions& sampling) {
  cmd->add_option("--temperature", sampling.temperature, "Sampling temperature; 0 = greedy")
      ->capture_default_str();
  cmd->add_option("--top-k", sampling.top_k, "Keep the k most likely tokens; 0 = all")
      ->capture_default_str();
  cmd->add_option("--top-p", sampling.top_p, "Nucleus sampling mass")->capture_default_str();
  cmd->add_option("--seed", sampling.seed, "Random seed for sampling")->capture_default_str();
}

}  // namespace ekva::cli
