#include "eval/tasks.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <random>

#include "core/error.h"
#include "io/json_file.h"

namespace ekva {
namespace {

// std::mt19937_64's output is fixed by the standard, but the std distributions are not, so the
// draws below are written out to keep instances identical across standard libraries.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  // Uniform in [0, n), by rejection so that no value is favoured.
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;
    for (;;) {
      const uint64_t r = engine_();
      if (r >= threshold) return r % n;
    }
  }

  // A number of `n` decimal digits without a leading zero.
  std::string digits(int n) {
    std::string s(1, static_cast<char>('1' + below(9)));
    while (static_cast<int>(s.size()) < n) s += static_cast<char>('0' + below(10));
    return s;
  }

  std::string letters(int n, std::string_view alphabet) {
    std::string s;
    while (static_cast<int>(s.size()) < n) s += alphabet[below(alphabet.size())];
    return s;
  }

  template <typename T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  std::mt19937_64 engine_;
};

constexpr std::array<std::string_view, 5> kNoise = {"The grass is green.", "The sky is blue.",
                                                    "The sun is yellow.", "Here we go.",
                                                    "There and back again."};

constexpr std::array<std::string_view, 32> kAdjectives = {
    "amber",  "brave",  "calm",    "dusty",  "eager",  "faint",  "gentle", "hollow",
    "icy",    "jolly",  "keen",    "lively", "mellow", "narrow", "odd",    "pale",
    "quiet",  "rapid",  "silent",  "tall",   "urban",  "vivid",  "wild",   "young",
    "bitter", "clever", "distant", "early",  "fierce", "golden", "humble", "silver"};
constexpr std::array<std::string_view, 32> kNouns = {
    "anchor", "badger", "canyon", "dragon",  "engine",   "falcon", "garden",  "harbor",
    "island", "jacket", "kettle", "lantern", "meadow",   "needle", "orchard", "pepper",
    "quarry", "river",  "saddle", "tunnel",  "umbrella", "valley", "walnut",  "yard",
    "beacon", "candle", "forest", "glacier", "hammer",   "mirror", "pebble",  "violin"};

constexpr std::string_view kHex = "0123456789abcdef";
constexpr std::string_view kUpper = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
constexpr std::array<std::string_view, 12> kMonths = {
    "January", "February", "March",     "April",   "May",      "June",
    "July",    "August",   "September", "October", "November", "December"};

// The noun is drawn before the adjective: multikey-needle's keys were first made by one expression
// whose operands GCC evaluated right to left, and its instances (the embedded model's training
// data) must stay what they were.
std::string word_pair(Rng& rng, std::string_view separator) {
  const std::string_view noun = kNouns[rng.below(kNouns.size())];
  const std::string_view adjective = kAdjectives[rng.below(kAdjectives.size())];
  return std::string(adjective) + std::string(separator) + std::string(noun);
}

// A random UUID's first four groups, 8-4-4-4 hex digits: the embedded tokenizer spends a token per
// hex digit, and the whole 36 characters would not fit the 30 answer tokens the evaluation allows.
std::string uuid(Rng& rng) {
  std::string s;
  for (int n : {8, 4, 4, 4}) s += (s.empty() ? "" : "-") + rng.letters(n, kHex);
  return s;
}

// "7 October 1962": day 1-28, so that every month has it.
std::string date(Rng& rng) {
  const uint64_t day = 1 + rng.below(28);
  const std::string_view month = kMonths[rng.below(kMonths.size())];
  return std::to_string(day) + " " + std::string(month) + " " +
         std::to_string(1900 + rng.below(200));
}

// A prompt before its length is fitted: facts to hide, in order, among filler.
struct Layout {
  std::string header;
  std::vector<std::string> facts;
  std::string question;
  std::string answer;
};

class FillerSource {
 public:
  FillerSource(const std::vector<std::string>* paragraphs, Rng& rng)
      : paragraphs_(paragraphs != nullptr && !paragraphs->empty() ? paragraphs : nullptr),
        start_(paragraphs_ != nullptr ? rng.below(paragraphs_->size()) : 0) {}

  std::string_view separator() const { return paragraphs_ != nullptr ? "\n\n" : " "; }
  std::string_view unit(size_t i) const {
    if (paragraphs_ != nullptr) return (*paragraphs_)[(start_ + i) % paragraphs_->size()];
    return kNoise[i % kNoise.size()];
  }
  size_t distinct_units() const {
    return paragraphs_ != nullptr ? paragraphs_->size() : kNoise.size();
  }

 private:
  const std::vector<std::string>* paragraphs_;
  size_t start_;
};

std::string join_context(const Layout& layout, const std::vector<std::string_view>& filler,
                         const std::vector<size_t>& fact_positions, std::string_view separator) {
  std::string text = layout.header;
  size_t next_fact = 0;
  for (size_t i = 0; i <= filler.size(); ++i) {
    while (next_fact < layout.facts.size() && fact_positions[next_fact] == i) {
      text += separator;
      text += layout.facts[next_fact++];
    }
    if (i < filler.size()) {
      text += separator;
      text += filler[i];
    }
  }
  return text;
}

// Tokens that `text` adds after other text. Counting it alone would count the word-start marker
// that SentencePiece-style tokenizers put at the beginning of a text.
size_t tokens_after(const TokenCounter& count_tokens, std::string_view text) {
  static const std::string kProbe = "x";
  return count_tokens(kProbe + std::string(text)) - count_tokens(kProbe);
}

// Unit counts are estimates (tokens can merge across a join), so the prompt is assembled, counted
// exactly, and then trimmed or grown one unit at a time until it fits; this bounds the exact
// recounts when growing.
constexpr size_t kMaxGrowthTries = 8;

// Fills the room the facts leave with filler, hides the facts at uniform depths (keeping their
// order), and fits the prompt to the exact count.
TaskInstance fit_layout(TaskKind kind, uint64_t seed, Layout layout, Rng& rng,
                        const TaskOptions& options, const TokenCounter& count_tokens) {
  FillerSource source(options.filler, rng);
  const std::string separator(source.separator());
  size_t fixed = count_tokens(layout.header) + tokens_after(count_tokens, layout.question);
  for (const auto& fact : layout.facts) fixed += tokens_after(count_tokens, separator + fact);
  if (fixed > options.prompt_tokens) {
    fail(ErrorKind::kInvalidArgument,
         "task {}: a prompt of {} tokens is too short; its facts and question alone take {}",
         task_name(kind), options.prompt_tokens, fixed);
  }
  std::vector<std::string_view> filler;
  size_t room = options.prompt_tokens - fixed;
  // A unit that does not fit is skipped, so shorter ones after it can still fill the room.
  const size_t max_misses = std::min<size_t>(source.distinct_units(), 64);
  size_t next = 0;
  for (size_t misses = 0; misses < max_misses; ++next) {
    const std::string_view unit = source.unit(next);
    const size_t n = tokens_after(count_tokens, separator + std::string(unit));
    if (n <= room) {
      filler.push_back(unit);
      room -= n;
      misses = 0;
    } else {
      ++misses;
    }
  }
  std::vector<size_t> positions(layout.facts.size());
  for (auto& p : positions) p = rng.below(filler.size() + 1);
  std::sort(positions.begin(), positions.end());

  TaskInstance instance{kind, seed, {}, layout.question, layout.answer, 0};
  auto assemble = [&] {
    instance.context = join_context(layout, filler, positions, separator);
    instance.prompt_tokens = count_tokens(instance.prompt());
  };
  assemble();
  if (instance.prompt_tokens <= options.prompt_tokens) {
    for (size_t tries = 0; tries < kMaxGrowthTries; ++tries, ++next) {
      const TaskInstance fitting = instance;
      filler.push_back(source.unit(next));
      assemble();
      if (instance.prompt_tokens > options.prompt_tokens) {
        filler.pop_back();
        instance = fitting;
      }
    }
  }
  while (instance.prompt_tokens > options.prompt_tokens && !filler.empty()) {
    filler.pop_back();
    for (auto& p : positions) p = std::min(p, filler.size());
    assemble();
  }
  if (instance.prompt_tokens > options.prompt_tokens) {
    fail(ErrorKind::kInvalidArgument, "task {}: the prompt takes {} tokens, more than {}",
         task_name(kind), instance.prompt_tokens, options.prompt_tokens);
  }
  return instance;
}

// The passkey test's needle; the held-out needles keep its sentences and change what the value is
// called and what it looks like.
Layout needle_layout(const std::string& what, const std::string& value) {
  return {
      "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
      "it. I will quiz you about the important information there.",
      {"The " + what + " is " + value + ". Remember it. " + value + " is the " + what + "."},
      "\nWhat is the " + what + "? The " + what + " is",
      " " + value};
}

constexpr std::string_view kMagicNumbersHeader =
    "Some special magic numbers are hidden within the following text. Make sure to memorize "
    "them. I will quiz you about the numbers afterwards.";

Layout multikey_layout(Rng& rng) {
  constexpr int kNeedles = 4;
  std::vector<std::string> keys;
  while (static_cast<int>(keys.size()) < kNeedles) {
    std::string key = word_pair(rng, "-");
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(std::move(key));
  }
  Layout layout;
  layout.header = kMagicNumbersHeader;
  std::vector<std::string> numbers;
  for (const auto& key : keys) {
    numbers.push_back(rng.digits(7));
    layout.facts.push_back("One of the special magic numbers for " + key +
                           " is: " + numbers.back() + ".");
  }
  const size_t asked = rng.below(kNeedles);
  layout.question = "\nWhat is the special magic number for " + keys[asked] +
                    " mentioned in the provided text? The special magic number for " + keys[asked] +
                    " mentioned in the provided text is";
  layout.answer = " " + numbers[asked];
  return layout;
}

// RULER's multi-value needle: one key, several values, all asked for (in the context's order).
// Three values rather than RULER's four: four 7-digit numbers take more than the 30 answer tokens
// the evaluation allows with the embedded tokenizer (a token per digit).
Layout multivalue_layout(Rng& rng) {
  constexpr int kValues = 3;
  const std::string key = word_pair(rng, "-");
  Layout layout;
  layout.header = kMagicNumbersHeader;
  std::vector<std::string> values;
  while (static_cast<int>(values.size()) < kValues) {
    std::string value = rng.digits(7);
    if (std::find(values.begin(), values.end(), value) == values.end()) values.push_back(value);
  }
  for (const auto& value : values) {
    layout.facts.push_back("One of the special magic numbers for " + key + " is: " + value + ".");
    layout.answer += (layout.answer.empty() ? " " : ", ") + value;
  }
  layout.question = "\nWhat are all the special magic numbers for " + key +
                    " mentioned in the provided text? The special magic numbers for " + key +
                    " mentioned in the provided text are";
  return layout;
}

Layout variable_tracking_layout(Rng& rng) {
  constexpr int kChains = 2, kHops = 4;
  std::vector<std::string> names;
  while (static_cast<int>(names.size()) < kChains * (kHops + 1)) {
    std::string name = rng.letters(5, kUpper);
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  std::vector<std::string> values;
  while (static_cast<int>(values.size()) < kChains) {
    std::string value = rng.digits(5);
    if (std::find(values.begin(), values.end(), value) == values.end()) values.push_back(value);
  }
  // Each chain's assignments must stay in order; the chains are interleaved at random.
  std::vector<std::vector<std::string>> chains(kChains);
  for (int c = 0; c < kChains; ++c) {
    const std::string* chain_names = &names[static_cast<size_t>(c) * (kHops + 1)];
    chains[c].push_back("VAR " + chain_names[0] + " = " + values[c] + ".");
    for (int h = 1; h <= kHops; ++h) {
      chains[c].push_back("VAR " + chain_names[h] + " = VAR " + chain_names[h - 1] + ".");
    }
  }
  Layout layout;
  layout.header =
      "Memorize and track the chain(s) of variable assignment hidden in the following text.";
  std::vector<size_t> next(kChains, 0);
  for (size_t remaining = kChains * (kHops + 1); remaining > 0; --remaining) {
    size_t pick = rng.below(remaining);
    for (int c = 0; c < kChains; ++c) {
      const size_t left = chains[c].size() - next[c];
      if (pick < left) {
        layout.facts.push_back(chains[c][next[c]++]);
        break;
      }
      pick -= left;
    }
  }
  const size_t asked = rng.below(kChains);
  layout.question = "\nQuestion: Find all variables that are assigned the value " + values[asked] +
                    " in the text above.\nAnswer: The variables assigned the value " +
                    values[asked] + " are:";
  for (int h = 0; h <= kHops; ++h) layout.answer += " " + names[asked * (kHops + 1) + h];
  return layout;
}

// The whole context is key-value pairs, so its length is fitted by the number of pairs.
// kv-retrieval-odd draws its odd value after everything kv-retrieval draws before fitting, so that
// adding it left kv-retrieval's instances as they were.
TaskInstance kv_retrieval(TaskKind kind, uint64_t seed, Rng& rng, const TaskOptions& options,
                          const TokenCounter& count_tokens) {
  const std::string header =
      "Extract the value corresponding to the specified key in the JSON object below.\n{";
  // The question ends by restating the asked key's entry up to its value's opening quote, so the
  // answer's tokens are exactly those of the value in the context (after a space the first hex
  // letters would tokenize differently).
  const auto question_for = [](const std::string& key) {
    return "\n}\nWhat is the value of the key \"" + key + "\"?\nAnswer: \"" + key + "\": \"";
  };
  auto line = [](const std::pair<std::string, std::string>& kv) {
    return "\n  \"" + kv.first + "\": \"" + kv.second + "\",";
  };
  auto new_pair = [&rng] {
    return std::pair<std::string, std::string>{rng.letters(8, kHex), rng.letters(8, kHex)};
  };
  // A question naming a key takes about as many tokens as one with any other key of the form.
  const size_t fixed = count_tokens(header) + tokens_after(count_tokens, question_for("00000000"));
  if (fixed > options.prompt_tokens) {
    fail(ErrorKind::kInvalidArgument, "task {}: a prompt of {} tokens is too short",
         task_name(kind), options.prompt_tokens);
  }
  std::vector<std::pair<std::string, std::string>> pairs;
  size_t room = options.prompt_tokens - fixed;
  for (;;) {
    auto kv = new_pair();
    const size_t n = tokens_after(count_tokens, line(kv));
    if (n > room) break;
    room -= n;
    pairs.push_back(std::move(kv));
  }
  const uint64_t asked_draw = rng.below(uint64_t{1} << 62);
  const std::string odd_value = kind == TaskKind::kKvRetrievalOdd ? word_pair(rng, "-") : "";
  TaskInstance instance{kind, seed, {}, {}, {}, 0};
  auto assemble = [&] {
    if (pairs.empty()) {
      fail(ErrorKind::kInvalidArgument,
           "task {}: a prompt of {} tokens cannot hold a key-value pair", task_name(kind),
           options.prompt_tokens);
    }
    const size_t asked = asked_draw % pairs.size();
    instance.context = header;
    for (size_t i = 0; i < pairs.size(); ++i) {
      instance.context +=
          i == asked && !odd_value.empty() ? line({pairs[i].first, odd_value}) : line(pairs[i]);
    }
    instance.question = question_for(pairs[asked].first);
    instance.answer = odd_value.empty() ? pairs[asked].second : odd_value;
    instance.prompt_tokens = count_tokens(instance.prompt());
  };
  assemble();
  if (instance.prompt_tokens <= options.prompt_tokens) {
    for (size_t tries = 0; tries < kMaxGrowthTries; ++tries) {
      const TaskInstance fitting = instance;
      pairs.push_back(new_pair());
      assemble();
      if (instance.prompt_tokens > options.prompt_tokens) {
        pairs.pop_back();
        instance = fitting;
        break;
      }
    }
  }
  while (instance.prompt_tokens > options.prompt_tokens) {
    pairs.pop_back();
    assemble();
  }
  return instance;
}

// The first `limit` maximal runs of letters and digits of s.
std::vector<std::string_view> alnum_runs(std::string_view s, size_t limit) {
  const auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  std::vector<std::string_view> runs;
  size_t i = 0;
  while (runs.size() < limit) {
    while (i < s.size() && !alnum(s[i])) ++i;
    if (i == s.size()) break;
    const size_t start = i;
    while (i < s.size() && alnum(s[i])) ++i;
    runs.push_back(s.substr(start, i - start));
  }
  return runs;
}

}  // namespace

std::string_view task_name(TaskKind kind) {
  switch (kind) {
    case TaskKind::kPasskey:
      return "passkey";
    case TaskKind::kMultiKeyNeedle:
      return "multikey-needle";
    case TaskKind::kKvRetrieval:
      return "kv-retrieval";
    case TaskKind::kVariableTracking:
      return "variable-tracking";
    case TaskKind::kNeedleWords:
      return "needle-words";
    case TaskKind::kNeedleUuid:
      return "needle-uuid";
    case TaskKind::kNeedleDate:
      return "needle-date";
    case TaskKind::kMultiValueNeedle:
      return "multivalue-needle";
    case TaskKind::kKvRetrievalOdd:
      return "kv-retrieval-odd";
  }
  return "unknown";
}

const std::vector<TaskKind>& all_tasks() {
  static const std::vector<TaskKind> kinds = {
      TaskKind::kPasskey,          TaskKind::kMultiKeyNeedle,   TaskKind::kKvRetrieval,
      TaskKind::kVariableTracking, TaskKind::kNeedleWords,      TaskKind::kNeedleUuid,
      TaskKind::kNeedleDate,       TaskKind::kMultiValueNeedle, TaskKind::kKvRetrievalOdd};
  return kinds;
}

TaskKind parse_task_name(std::string_view name) {
  std::string known;
  for (TaskKind kind : all_tasks()) {
    if (task_name(kind) == name) return kind;
    known += (known.empty() ? "" : ", ") + std::string(task_name(kind));
  }
  fail(ErrorKind::kInvalidArgument, "unknown task '{}' (known: {})", name, known);
}

uint64_t instance_seed(uint64_t base_seed, uint64_t index) {
  // splitmix64 of the pair, so that neighbouring seeds and indices give unrelated streams.
  uint64_t z = base_seed + 0x9e3779b97f4a7c15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

TaskInstance generate_task(TaskKind kind, uint64_t seed, const TaskOptions& options,
                           const TokenCounter& count_tokens) {
  Rng rng(seed);
  switch (kind) {
    case TaskKind::kPasskey:
      return fit_layout(kind, seed, needle_layout("pass key", rng.digits(5)), rng, options,
                        count_tokens);
    case TaskKind::kNeedleWords:
      return fit_layout(kind, seed, needle_layout("secret phrase", word_pair(rng, " ")), rng,
                        options, count_tokens);
    case TaskKind::kNeedleUuid:
      return fit_layout(kind, seed, needle_layout("access token", uuid(rng)), rng, options,
                        count_tokens);
    case TaskKind::kNeedleDate:
      return fit_layout(kind, seed, needle_layout("launch date", date(rng)), rng, options,
                        count_tokens);
    case TaskKind::kMultiKeyNeedle:
      return fit_layout(kind, seed, multikey_layout(rng), rng, options, count_tokens);
    case TaskKind::kMultiValueNeedle:
      return fit_layout(kind, seed, multivalue_layout(rng), rng, options, count_tokens);
    case TaskKind::kVariableTracking:
      return fit_layout(kind, seed, variable_tracking_layout(rng), rng, options, count_tokens);
    case TaskKind::kKvRetrieval:
    case TaskKind::kKvRetrievalOdd:
      return kv_retrieval(kind, seed, rng, options, count_tokens);
  }
  fail(ErrorKind::kInvalidArgument, "unknown task kind {}", static_cast<int>(kind));
}

bool answer_matches(const TaskInstance& instance, std::string_view continuation) {
  if (instance.kind == TaskKind::kMultiValueNeedle) {
    std::vector<std::string_view> expected = alnum_runs(instance.answer, SIZE_MAX);
    std::vector<std::string_view> given = alnum_runs(continuation, expected.size());
    std::sort(expected.begin(), expected.end());
    std::sort(given.begin(), given.end());
    return given == expected;
  }
  // The answer must be the whole next word group: "58213" does not answer with "582130".
  auto skip_spaces = [](std::string_view s) {
    const auto first = s.find_first_not_of(' ');
    return first == std::string_view::npos ? std::string_view{} : s.substr(first);
  };
  const std::string_view answer = skip_spaces(instance.answer);
  const std::string_view given = skip_spaces(continuation);
  if (given.substr(0, answer.size()) != answer) return false;
  return given.size() == answer.size() ||
         !std::isalnum(static_cast<unsigned char>(given[answer.size()]));
}

std::vector<std::string> split_paragraphs(std::string_view text) {
  std::vector<std::string> paragraphs;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find("\n\n", start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view p = text.substr(start, end - start);
    const auto first = p.find_first_not_of(" \n\t");
    if (first != std::string_view::npos) {
      p = p.substr(first, p.find_last_not_of(" \n\t") - first + 1);
      paragraphs.emplace_back(p);
    }
    start = end + 2;
  }
  return paragraphs;
}

std::vector<std::string> read_filler(const std::filesystem::path& path) {
  std::vector<std::string> paragraphs = split_paragraphs(read_text_file(path));
  if (paragraphs.empty()) {
    fail(ErrorKind::kInvalidArgument, "{}: the filler text holds no paragraph", path.string());
  }
  return paragraphs;
}

}  // namespace ekva
