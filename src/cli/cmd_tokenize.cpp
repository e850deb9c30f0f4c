#include <fmt/format.h>

#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "io/json_file.h"
#include "tokenizer/tokenizer.h"

namespace ekva::cli {
namespace {

std::string read_stdin() {
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

std::vector<int32_t> parse_id_array(const std::string& text) {
  const nlohmann::json j = parse_json(text, "stdin");
  if (!j.is_array()) fail(ErrorKind::kInvalidArgument, "stdin: expected a JSON array of ids");
  std::vector<int32_t> ids;
  ids.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    if (!json_integer_in(j[i], INT32_MIN, INT32_MAX)) {
      fail(ErrorKind::kInvalidArgument, "stdin: element {} ({}) is not a token id", i,
           json_excerpt(j[i]));
    }
    ids.push_back(static_cast<int32_t>(j[i].get<int64_t>()));
  }
  return ids;
}

}  // namespace

void add_tokenize(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "tokenize", "Encode UTF-8 text from stdin (all of it, a final newline included) into ids");
  auto path = std::make_shared<std::string>();
  auto add_special = std::make_shared<bool>(false);
  auto json = std::make_shared<bool>(false);
  cmd->add_option("--tokenizer", *path,
                  "tokenizer.json, SentencePiece .model, or a model directory")
      ->required();
  cmd->add_flag("--add-special", *add_special, "Add the BOS/EOS tokens the tokenizer asks for");
  cmd->add_flag("--json", *json, "Print a JSON array of ids and nothing else");
  cmd->callback([&action, path, add_special, json] {
    action = [path, add_special, json] {
      const auto tokenizer = load_tokenizer(*path);
      const std::vector<int32_t> ids = tokenizer->encode(read_stdin(), *add_special);
      if (*json) {
        fmt::print("{}\n", nlohmann::json(ids).dump());
      } else {
        fmt::print("{}\n", fmt::join(ids, ","));
      }
      return 0;
    };
  });
}

void add_detokenize(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("detokenize", "Decode a JSON array of token ids from stdin");
  auto path = std::make_shared<std::string>();
  auto skip_special = std::make_shared<bool>(false);
  cmd->add_option("--tokenizer", *path,
                  "tokenizer.json, SentencePiece .model, or a model directory")
      ->required();
  cmd->add_flag("--skip-special", *skip_special, "Leave special tokens (BOS, EOS, ...) out");
  cmd->callback([&action, path, skip_special] {
    action = [path, skip_special] {
      const auto tokenizer = load_tokenizer(*path);
      // The text exactly, with no newline added, so that tokenize/detokenize round-trip.
      fmt::print("{}", tokenizer->decode(parse_id_array(read_stdin()), *skip_special));
      return 0;
    };
  });
}

}  // namespace ekva::cli
