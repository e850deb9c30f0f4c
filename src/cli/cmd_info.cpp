#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "io/model_config.h"
#include "model/model.h"

namespace ekva::cli {

void add_info(CLI::App& app, Action& action) {
  auto* cmd =
      app.add_subcommand("info", "Describe a model: architecture, parameters, KV bytes per token");
  auto model_dir = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("--model", *model_dir, "Model directory (config.json + safetensors)")->required();
  cmd->add_flag("--json", *json, "Print one JSON object");
  auto kv_dtype = std::make_shared<std::string>("f32");
  cmd->add_option("--kv-dtype", *kv_dtype,
                  "Element type the engine stores K and V in (as generate/eval --kv-dtype)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->callback([&action, model_dir, json, kv_dtype] {
    action = [model_dir, json, kv_dtype] {
      const auto model = Model::load(*model_dir);
      const ModelSpec& s = model->spec();
      const auto params = s.parameters();
      const DType kv = *kv_dtype == "bf16" ? DType::kBF16 : DType::kF32;
      const int64_t kv_token = s.kv_bytes_per_token(dtype_size(kv));
      nlohmann::json j = {
          {"architecture", s.model_type},
          {"layers", s.num_layers},
          {"moe_layers", s.num_moe_layers()},
          {"hidden_size", s.hidden_size},
          {"attention_heads", s.num_heads},
          {"kv_heads", s.num_kv_heads},
          {"head_dim", s.head_dim},
          {"vocab_size", s.vocab_size},
          {"context", s.max_position},
          {"experts", s.num_experts},
          {"experts_per_token", s.top_k},
          {"shared_expert_intermediate", s.shared_intermediate},
          {"parameters_total", params.total},
          {"parameters_active_per_token", params.active_per_token},
          {"weight_dtype", std::string(dtype_name(s.weight_dtype))},
          {"kv_dtype", std::string(dtype_name(kv))},
          {"kv_bytes_per_token", kv_token},
          {"active_weight_bytes_per_token", model->active_weight_bytes_per_token()},
      };
      if (*json) {
        fmt::print("{}\n", j.dump(2));
        return 0;
      }
      fmt::print("architecture        {}\n", s.model_type);
      fmt::print("layers              {} ({} MoE)\n", s.num_layers, s.num_moe_layers());
      fmt::print("hidden / heads      {} / {} query, {} KV, head_dim {}\n", s.hidden_size,
                 s.num_heads, s.num_kv_heads, s.head_dim);
      fmt::print("experts             {} routed, top-{}{}\n", s.num_experts, s.top_k,
                 s.shared_intermediate > 0 ? ", plus a shared expert" : "");
      fmt::print("vocab / context     {} / {}\n", s.vocab_size, s.max_position);
      fmt::print("parameters          {} total, {} active per token\n", params.total,
                 params.active_per_token);
      fmt::print("weights             {}\n", dtype_name(s.weight_dtype));
      fmt::print("KV bytes per token  {} (at {})\n", kv_token, dtype_name(kv));
      return 0;
    };
  });
}

}  // namespace ekva::cli
