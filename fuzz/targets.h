#pragma once
// What each libFuzzer target does with one input, shared with the unit test that replays the
// inputs kept in tests/fixtures/fuzz-regressions. Each feeds the input to one public loader; an
// ekva::Error is the expected answer to bad input, and anything else (another exception, a
// signal, a sanitizer report) is a finding.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
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
// the loader dispatches on (tokenizer.json against a SentencePiece model). The directory is made
// once, not per input, and the file is written with write(2), not an ofstream (whose 8 KiB buffer
// ASan allocates and fills for every input): the loader reading the file back is what is tested.
// scripts/fuzz.sh puts TMPDIR on tmpfs, where writing and reading it back costs no disk.
inline std::filesystem::path input_directory() {
  return std::filesystem::temp_directory_path() / ("ekva_fuzz_" + std::to_string(::getpid()));
}

inline std::filesystem::path input_file(std::string_view input, const std::string& name) {
  static const std::filesystem::path dir = input_directory();
  const auto path = dir / name;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 && errno == ENOENT) {  // the first input, or remove_input_files() has run
    std::filesystem::create_directories(dir);
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  }
  // Not an ekva::Error: a harness that cannot write its input must not pass as a loader's answer.
  if (fd < 0) throw std::runtime_error(path.string() + ": " + std::strerror(errno));
  for (size_t done = 0; done < input.size();) {
    const ssize_t n = ::write(fd, input.data() + done, input.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string reason = std::strerror(errno);
      ::close(fd);
      throw std::runtime_error(path.string() + ": " + reason);
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return path;
}

// Removes this process's input files (the replaying test calls it; a fuzz run's TMPDIR is
// removed by scripts/fuzz.sh).
inline void remove_input_files() {
  std::error_code ec;
  std::filesystem::remove_all(input_directory(), ec);
}

// A file of the repository the targets read (the fixture tokenizers; the embedded model's config
// and tokenizer): under the sources this was built from, or under $EKVA_FUZZ_ROOT when set (a copy
// of those files in the repository's layout, as scripts/fuzz-pack.sh packs them for another
// machine, where the path compiled in does not exist).
inline std::filesystem::path source_file(const std::string& relative) {
  const char* root = std::getenv("EKVA_FUZZ_ROOT");
  if (root != nullptr && *root != '\0') return std::filesystem::path(root) / relative;
  return std::filesystem::path(EKVA_FIXTURES) / ".." / ".." / relative;
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
    const std::filesystem::path dir = source_file("tests/fixtures/tokenizers");
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
  static const std::filesystem::path dir = source_file("models/ekva-moe-8m");
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
