#pragma once
// Where tests find the repository's files. EKVA_FIXTURES is tests/fixtures (tests/CMakeLists.txt).
#include <filesystem>
#include <string>

namespace ekva::testing {

inline const std::filesystem::path kRepoRoot =
    std::filesystem::path(EKVA_FIXTURES).parent_path().parent_path();
// The embedded default model.
inline const std::string kEmbeddedModel = (kRepoRoot / "models/ekva-moe-8m").string();

// A tokenizer file of tests/fixtures/tokenizers.
inline std::filesystem::path tokenizer_fixture(const std::string& name) {
  return std::filesystem::path(EKVA_FIXTURES) / "tokenizers" / name;
}

// The config.json of a full-size model shape in tests/fixtures/configs.
inline std::string config_json(const std::string& name) {
  return (std::filesystem::path(EKVA_FIXTURES) / "configs" / name / "config.json").string();
}

}  // namespace ekva::testing
