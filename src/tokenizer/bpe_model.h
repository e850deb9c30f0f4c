#pragma once
// The BPE model of tokenizer.json: vocabulary, rank-ordered merges, byte fallback and unk.
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <shared_mutex>
#include <span>
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

  // From now on encode_word takes raw bytes and maps them to the byte-level alphabet itself, so
  // that words found in the cache skip the mapping. Call before encoding anything.
  void take_raw_bytes();

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

  // Encodes a word that no merge crosses out of, through the word cache.
  void encode_piece(std::string_view word, std::vector<int32_t>& ids) const;
  // The initial symbols of a word: one per character, or its bytes' fallback tokens, or unk.
  void initial_symbols(std::string_view word, std::vector<int32_t>& ids) const;
  void apply_merges(std::vector<int32_t>& ids) const;
  const Merge* find_merge(int32_t left, int32_t right) const;

  StringMap<int32_t> vocab_;
  // By id, pointing into vocab_'s keys (stable: the map is node-based); null where no token has
  // the id.
  std::vector<const std::string*> tokens_;
  MergeTable merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  int32_t byte_ids_[256];  // <0xHH> tokens for byte fallback; -1 where absent
  // Ids of the byte-level alphabet's 256 characters; -1 where absent.
  int32_t byte_level_ids_[256];
  bool raw_bytes_ = false;
  // Whether a raw-byte word's initial symbols are just byte_level_ids_ of its bytes.
  bool raw_bytes_direct_ = false;
  // Ids of single-character tokens by code point in the Basic Multilingual Plane; -1 where absent.
  std::vector<int32_t> char_ids_;
  // Whether words may be cut before each "▁" that follows other text: true when no token holds
  // "▁" after other text, so no merge can cross such a point (SentencePiece-style vocabularies).
  bool cut_at_word_marker_ = false;

  // Encoded words, as Hugging Face keeps them: real text repeats its words, so most are looked
  // up rather than merged. Open addressing over flat arenas; a node-based map's cache misses cost
  // more than the merges it saved.
  class WordCache {
   public:
    WordCache();
    // Appends the cached ids of `word` to `ids`; false when it is not cached.
    bool append(std::string_view word, uint64_t hash, std::vector<int32_t>& ids) const;
    // Does nothing once the cache is full.
    void insert(std::string_view word, uint64_t hash, std::span<const int32_t> word_ids);

    static constexpr size_t kMaxWordBytes = 255;

   private:
    struct Slot {
      uint64_t hash = 0;  // 0: empty
      uint32_t key_offset = 0, ids_offset = 0;
      uint8_t key_length = 0;
      uint16_t ids_length = 0;
    };
    static constexpr size_t kSlots = 1 << 18;
    static constexpr size_t kMaxEntries = kSlots / 2;
    std::vector<Slot> slots_;
    std::string keys_;
    std::vector<int32_t> ids_;
    size_t entries_ = 0;
    mutable std::shared_mutex mutex_;
  };
  mutable WordCache cache_;
};

}  // namespace ekva
