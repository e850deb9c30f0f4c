// Encoding throughput (bytes of UTF-8 in per second, one thread) on ~3 MB of mixed text: English
// prose and Chinese/Japanese/Korean prose from Debian's linux-doc package, C++ code from
// libstdc++'s headers, cut into documents of at most 16 KB and interleaved. The Mistral v0.3
// tokenizer runs side by side as tokenizer.json (ours) and as tokenizer.model (libsentencepiece,
// called directly); the .json and .model give the same ids. Byte-level BPE uses OLMoE's and
// dolma2's tokenizer.json. "Warm" keeps one tokenizer across iterations (its word cache filled, as
// in a server); "Cold" loads a fresh tokenizer before each pass (load time not counted).
#include <benchmark/benchmark.h>
#include <sentencepiece_processor.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/tokenizer.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(EKVA_DATA_DIR).parent_path() / "tests/fixtures/tokenizers";
constexpr size_t kBytesPerKind = 1 << 20;
constexpr size_t kDocumentBytes = 16 << 10;

// Documents of at most kDocumentBytes, cut at line ends, from the files under `roots` whose names
// end in `suffix`, until `budget` bytes.
std::vector<std::string> documents_from(const std::vector<fs::path>& roots,
                                        const std::string& suffix, size_t budget) {
  std::vector<fs::path> files;
  for (const auto& root : roots) {
    if (!fs::is_directory(root)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root)) {
      if (entry.is_regular_file() && entry.path().string().ends_with(suffix)) {
        files.push_back(entry.path());
      }
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> docs;
  size_t total = 0;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    for (size_t pos = 0; pos < text.size() && total < budget;) {
      size_t end = std::min(text.size(), pos + kDocumentBytes);
      if (end < text.size()) {
        const size_t newline = text.rfind('\n', end);
        if (newline != std::string::npos && newline > pos) end = newline + 1;
      }
      docs.push_back(text.substr(pos, end - pos));
      total += end - pos;
      pos = end;
    }
    if (total >= budget) break;
  }
  return docs;
}

// Empty when a source is missing.
const std::vector<std::string>& corpus() {
  static const std::vector<std::string> docs = [] {
    const fs::path linux_doc = "/usr/share/doc/linux-doc-6.1/html/_sources";
    const std::vector<std::vector<std::string>> kinds = {
        documents_from({linux_doc / "admin-guide", linux_doc / "process"}, ".rst.txt",
                       kBytesPerKind),
        documents_from({"/usr/include/c++/12/bits"}, ".h", kBytesPerKind),
        documents_from({linux_doc / "translations/zh_CN", linux_doc / "translations/ja_JP",
                        linux_doc / "translations/ko_KR"},
                       ".rst.txt", kBytesPerKind)};
    std::vector<std::string> mixed;
    for (const auto& kind : kinds) {
      size_t bytes = 0;
      for (const auto& d : kind) bytes += d.size();
      if (bytes < kBytesPerKind / 2) return mixed;
    }
    for (size_t i = 0;; ++i) {
      bool any = false;
      for (const auto& kind : kinds) {
        if (i < kind.size()) {
          mixed.push_back(kind[i]);
          any = true;
        }
      }
      if (!any) break;
    }
    return mixed;
  }();
  return docs;
}

bool have_corpus(benchmark::State& state) {
  if (!corpus().empty()) return true;
  state.SkipWithError(
      "corpus missing: needs Debian's linux-doc-6.1 and libstdc++-12-dev (/usr/include/c++/12)");
  return false;
}

int64_t corpus_bytes() {
  int64_t bytes = 0;
  for (const auto& d : corpus()) bytes += static_cast<int64_t>(d.size());
  return bytes;
}

void encode_all(const Tokenizer& tokenizer, benchmark::State& state) {
  int64_t tokens = 0;
  for (const auto& doc : corpus()) {
    const auto ids = tokenizer.encode(doc, false);
    tokens += static_cast<int64_t>(ids.size());
    benchmark::DoNotOptimize(ids.data());
  }
  state.counters["tokens"] = static_cast<double>(tokens);
}

void BM_EncodeWarm(benchmark::State& state, const std::string& file) {
  if (!have_corpus(state)) return;
  const auto tokenizer = load_tokenizer(kFixtures / file);
  for (auto _ : state) encode_all(*tokenizer, state);
  state.SetBytesProcessed(state.iterations() * corpus_bytes());
}

void BM_EncodeCold(benchmark::State& state, const std::string& file) {
  if (!have_corpus(state)) return;
  for (auto _ : state) {
    state.PauseTiming();
    const auto tokenizer = load_tokenizer(kFixtures / file);
    state.ResumeTiming();
    encode_all(*tokenizer, state);
  }
  state.SetBytesProcessed(state.iterations() * corpus_bytes());
}

void BM_EncodeSentencePiece(benchmark::State& state) {
  if (!have_corpus(state)) return;
  sentencepiece::SentencePieceProcessor processor;
  if (!processor.Load((kFixtures / "mistral-v3.tokenizer.model").string()).ok()) {
    state.SkipWithError("cannot load mistral-v3.tokenizer.model");
    return;
  }
  std::vector<int> ids;
  for (auto _ : state) {
    int64_t tokens = 0;
    for (const auto& doc : corpus()) {
      if (!processor.Encode(doc, &ids).ok()) {
        state.SkipWithError("SentencePiece failed to encode");
        return;
      }
      tokens += static_cast<int64_t>(ids.size());
      benchmark::DoNotOptimize(ids.data());
    }
    state.counters["tokens"] = static_cast<double>(tokens);
  }
  state.SetBytesProcessed(state.iterations() * corpus_bytes());
}

BENCHMARK(BM_EncodeSentencePiece)
    ->Name("Encode/mistral_v3/sentencepiece_model")
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_EncodeWarm, mistral_json, std::string("mistral-v3.tokenizer.json"))
    ->Name("Encode/mistral_v3/tokenizer_json_warm")
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_EncodeCold, mistral_json, std::string("mistral-v3.tokenizer.json"))
    ->Name("Encode/mistral_v3/tokenizer_json_cold")
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_EncodeWarm, olmo, std::string("allenai_gpt-neox-olmo-dolma-v1_5.json"))
    ->Name("Encode/olmoe_bytelevel/tokenizer_json_warm")
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_EncodeCold, olmo, std::string("allenai_gpt-neox-olmo-dolma-v1_5.json"))
    ->Name("Encode/olmoe_bytelevel/tokenizer_json_cold")
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_EncodeWarm, dolma2, std::string("allenai_dolma2.json"))
    ->Name("Encode/dolma2_bytelevel/tokenizer_json_warm")
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_EncodeCold, dolma2, std::string("allenai_dolma2.json"))
    ->Name("Encode/dolma2_bytelevel/tokenizer_json_cold")
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

}  // namespace
}  // namespace ekva

BENCHMARK_MAIN();
