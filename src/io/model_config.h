#pragma once
// config.json (Hugging Face, both the transformers-4 and the transformers-5 form) -> ModelSpec.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "arch/model_spec.h"

namespace ekva {

// `source` names the file in error messages.
ModelSpec parse_model_config(const nlohmann::json& config, const std::string& source);
// Accepts a model directory or a path to config.json.
ModelSpec load_model_config(const std::filesystem::path& dir_or_file);

}  // namespace ekva
