#pragma once
// The BPE model of tokenizer.json: vocabulary, rank-ordered merges, byte fallback and unk.
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ekva {

class BpeModel {
 public:
  // `spec` is tokenizer.json's "model" object; `where` names the file for errors.
  BpeModel(const nlohmann::json& spec, const std::string& where);

  // Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<int32_t>& ids) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // nullptr for an id that no token has.
  const std::string* id_to_token(int32_t id) const;
  // One past the largest id.
  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  template <typename Value>
  using StringMap = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;

  struct Merge {
    int32_t rank;
    int32_t result;
  };

  // Open-addressing map from a (left, right) id pair to its merge: merges are looked up a few
  // times per input byte, and a node-based map's cache misses dominated encoding.
  class MergeTable {
   public:
    void reserve(size_t count);
    void insert_or_assign(uint64_t key, Merge merge);
    const Merge* find(uint64_t key) const {
      for (size_t slot = index(key);; slot = (slot + 1) & mask_) {
        if (keys_[slot] == key) return &merges_[slot];
        if (keys_[slot] == kEmpty) return nullptr;
      }
    }

   private:
    static constexpr uint64_t kEmpty = ~0ull;
    size_t index(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
    std::vector<uint64_t> keys_;
    std::vector<Merge> merges_;
    size_t mask_ = 0;
    int shift_ = 64;
  };

  void encode_uncached(std::string_view word, std::vector<int32_t>& ids) const;
  // The initial symbols of a word: one per character, or its bytes' fallback tokens, or unk.
  void initial_symbols(std::string_view word, std::vector<int32_t>& ids) const;
  void apply_merges(std::vector<int32_t>& ids) const;
  const Merge* find_merge(int32_t left, int32_t right) const;

  StringMap<int32_t> vocab_;
  std::vector<std::string> tokens_;  // by id; empty where no token has the id
  std::vector<bool> has_token_;
  MergeTable merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  int32_t byte_ids_[256];  // <0xHH> tokens for byte fallback; -1 where absent
  // Ids of single-character tokens by code point in the Basic Multilingual Plane; -1 where absent.
  std::vector<int32_t> char_ids_;
  // Whether words may be cut before each "▁" that follows other text: true when no token holds
  // "▁" after other text, so no merge can cross such a point (SentencePiece-style vocabularies).
  bool cut_at_word_marker_ = false;

  static constexpr size_t kCacheCapacity = 1 << 17;
  static constexpr size_t kMaxCachedWordBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable StringMap<std::vector<int32_t>> cache_;
};

}  // namespace ekva
