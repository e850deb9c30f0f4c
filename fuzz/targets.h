#pragma once
// What each libFuzzer target does with one input, shared with the unit test that replays the
// inputs kept in tests/fixtures/fuzz-regressions. Each feeds the input to one public loader; an
// ekva::Error is the expected answer to bad input, and anything else (another exception, a
// signal, a sanitizer report) is a finding.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "budget/calibration.h"
#include "core/error.h"
#include "io/json_file.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "kv/budget_plan.h"
#include "roofline/hardware.h"
#include "roofline/measured.h"
#include "serve/completion.h"
#include "tokenizer/tokenizer.h"

namespace ekva::fuzz {

// Loaders that take a path read the input from this per-process file; `name` keeps the file name
// the loader dispatches on (tokenizer.json against a SentencePiece model).
inline std::filesystem::path input_file(std::string_view input, const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("ekva_fuzz_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / name;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(input.data(), static_cast<std::streamsize>(input.size()));
  return path;
}

// Removes this process's input files (the replaying test calls it; a fuzz run's TMPDIR is
// removed by scripts/fuzz.sh).
inline void remove_input_files() {
  std::error_code ec;
  std::filesystem::remove_all(
      std::filesystem::temp_directory_path() / ("ekva_fuzz_" + std::to_string(::getpid())), ec);
}

inline void safetensors_header(std::string_view input) {
  const SafetensorsFile file(input_file(input, "model.safetensors"));
  for (const auto& [name, tensor] : file.tensors()) {
    // An accepted tensor lies inside the mapped file: reading its last byte must not fault.
    if (tensor.bytes > 0) {
      volatile unsigned char last =
          static_cast<const unsigned char*>(tensor.data)[tensor.bytes - 1];
      (void)last;
    }
  }
}

inline void model_config(std::string_view input) {
  parse_model_config(parse_json(input, "config.json"), "config.json");
}

// Encodes and decodes with what loaded, so that every component's tables are used.
inline void use_tokenizer(const Tokenizer& tokenizer) {
  const std::vector<int32_t> ids = tokenizer.encode("Hello, world! 123  \xC3\xA9t\xC3\xA9\n", true);
  tokenizer.decode(ids, false);
  tokenizer.decode(ids, true);
}

inline void tokenizer_json(std::string_view input) {
  use_tokenizer(*load_tokenizer(input_file(input, "tokenizer.json")));
}

inline void sentencepiece_model(std::string_view input) {
  use_tokenizer(*load_tokenizer(input_file(input, "tokenizer.model")));
}

// Arbitrary bytes through the fixture tokenizers. The first byte picks the tokenizer and the
// direction: text to encode, as `ekva tokenize` reads it, or a JSON array of ids to decode, as
// `ekva detokenize` does.
inline void tokenize(std::string_view input) {
  static const auto tokenizers = [] {
    std::vector<std::unique_ptr<Tokenizer>> t;
    const std::filesystem::path dir = std::filesystem::path(EKVA_FIXTURES) / "tokenizers";
    for (const char* name : {"allenai_dolma2.json", "allenai_gpt-neox-olmo-dolma-v1_5.json",
                             "mistral-v3.tokenizer.json", "mistral-v3.tokenizer.model"}) {
      t.push_back(load_tokenizer(dir / name));
    }
    return t;
  }();
  if (input.empty()) return;
  const auto selector = static_cast<unsigned char>(input[0]);
  const Tokenizer& tokenizer = *tokenizers[selector % tokenizers.size()];
  const bool special = selector % 3 == 0;
  input.remove_prefix(1);
  if ((selector / tokenizers.size()) % 2 == 0) {
    tokenizer.decode(tokenizer.encode(input, special), special);
    return;
  }
  const nlohmann::json j = parse_json(input, "stdin");
  if (!j.is_array()) return;
  std::vector<int32_t> ids;
  for (const auto& id : j) {
    if (!id.is_number_integer() || id.get<int64_t>() < INT32_MIN || id.get<int64_t>() > INT32_MAX) {
      return;
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  tokenizer.decode(ids, special);
}

inline void budget_plan(std::string_view input) {
  BudgetPlan::load(input_file(input, "plan.json"));
}

inline void calibration_stats(std::string_view input) {
  CalibrationStats::load(input_file(input, "stats.json"));
}

inline void hardware(std::string_view input) {
  load_hardware_file(input_file(input, "hw.json"));
}

inline void measured_times(std::string_view input) {
  load_measured_times(input_file(input, "measured.json"));
}

// A POST /v1/completions body, checked against the embedded model and its tokenizer as the
// server checks it.
inline void completion_request(std::string_view input) {
  static const std::filesystem::path dir =
      std::filesystem::path(EKVA_FIXTURES) / ".." / ".." / "models" / "ekva-moe-8m";
  static const ModelSpec spec =
      parse_model_config(read_json_file(dir / "config.json"), "config.json");
  static const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(dir);
  serve::parse_completion_request(input, {&spec, tokenizer.get(), "ekva-moe-8m"});
}

using Target = void (*)(std::string_view);

// Every target by name (fuzz/CMakeLists.txt builds fuzz_NAME from NAME.cpp).
inline const std::map<std::string, Target>& targets() {
  static const std::map<std::string, Target> all = {
      {"safetensors_header", safetensors_header},
      {"model_config", model_config},
      {"tokenizer_json", tokenizer_json},
      {"sentencepiece_model", sentencepiece_model},
      {"tokenize", tokenize},
      {"budget_plan", budget_plan},
      {"calibration_stats", calibration_stats},
      {"hardware", hardware},
      {"measured_times", measured_times},
      {"completion_request", completion_request},
  };
  return all;
}

// Runs one target on one input; bad input must end in ekva::Error and nothing else.
inline void run(Target target, const uint8_t* data, size_t size) {
  try {
    target(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const Error&) {
  }
}

}  // namespace ekva::fuzz
