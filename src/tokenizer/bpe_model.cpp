#include "tokenizer/bpe_model.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace ekva {
namespace {

constexpr std::string_view kWordMarker = "\xE2\x96\x81";  // U+2581, SentencePiece's space

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Whether some token holds the word marker after other text.
bool marker_follows_text(std::string_view token) {
  size_t pos = 0;
  while (token.substr(pos).starts_with(kWordMarker)) pos += kWordMarker.size();
  return token.find(kWordMarker, pos) != std::string_view::npos;
}

}  // namespace

BpeModel::BpeModel(const nlohmann::json& spec, const std::string& where) {
  using namespace tokenizer_json;
  const std::string type = optional_string(spec, "type", "BPE", where);
  if (type != "BPE") {
    fail(ErrorKind::kUnsupported, "{}.type: model '{}' is not supported (only BPE)", where, type);
  }
  const auto dropout = spec.find("dropout");
  if (dropout != spec.end() && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    fail(ErrorKind::kUnsupported, "{}.dropout: BPE dropout is not supported", where);
  }
  fuse_unk_ = optional_bool(spec, "fuse_unk", false, where);
  byte_fallback_ = optional_bool(spec, "byte_fallback", false, where);
  ignore_merges_ = optional_bool(spec, "ignore_merges", false, where);
  continuing_subword_prefix_ = optional_string(spec, "continuing_subword_prefix", "", where);
  end_of_word_suffix_ = optional_string(spec, "end_of_word_suffix", "", where);

  const auto& vocab = required(spec, "vocab", where);
  if (!vocab.is_object()) fail(ErrorKind::kInvalidFile, "{}.vocab: expected an object", where);
  vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (const auto& [token, id_json] : vocab.items()) {
    const int32_t id = token_id(id_json, where + ".vocab['" + token + "']");
    vocab_.emplace(token, id);
    max_id = std::max(max_id, id);
  }
  tokens_.assign(max_id + 1, nullptr);
  for (const auto& [token, id] : vocab_) tokens_[id] = &token;

  const std::string unk = optional_string(spec, "unk_token", "", where);
  if (!unk.empty()) {
    unk_id_ = token_to_id(unk);
    if (!unk_id_) {
      fail(ErrorKind::kInvalidFile, "{}.unk_token: '{}' is not in the vocabulary", where, unk);
    }
  }
  for (int b = 0; b < 256; ++b) {
    byte_ids_[b] = token_to_id(fmt::format("<0x{:02X}>", b)).value_or(-1);
  }
  char_ids_.assign(0x10000, -1);
  for (const auto& [token, id] : vocab_) {
    size_t pos = 0;
    if (token.empty()) continue;
    const char32_t c = next_code_point(token, pos);
    if (pos == token.size() && c < 0x10000) char_ids_[c] = id;
  }

  const auto& merges = required_array(spec, "merges", where);
  merges_.reserve(merges.size());
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    std::string_view left, right;
    if (m.is_string()) {
      const std::string_view line = m.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        fail(ErrorKind::kInvalidFile, "{}.merges[{}]: '{}' is not two tokens separated by a space",
             where, rank, line);
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get_ref<const std::string&>();
      right = m[1].get_ref<const std::string&>();
    } else {
      fail(ErrorKind::kInvalidFile, "{}.merges[{}]: expected \"a b\" or [\"a\", \"b\"]", where,
           rank);
    }
    const auto left_id = token_to_id(left), right_id = token_to_id(right);
    if (!left_id || !right_id) {
      fail(ErrorKind::kInvalidFile, "{}.merges[{}]: token '{}' is not in the vocabulary", where,
           rank, left_id ? right : left);
    }
    merged.assign(left);
    merged.append(right.starts_with(continuing_subword_prefix_)
                      ? right.substr(continuing_subword_prefix_.size())
                      : right);
    const auto merged_id = token_to_id(merged);
    if (!merged_id) {
      fail(ErrorKind::kInvalidFile, "{}.merges[{}]: merged token '{}' is not in the vocabulary",
           where, rank, merged);
    }
    // A repeated pair keeps its last rank, as Hugging Face's map construction does.
    merges_.insert_or_assign(pair_key(*left_id, *right_id),
                             Merge{static_cast<int32_t>(rank), *merged_id});
  }

  cut_at_word_marker_ = !ignore_merges_ && continuing_subword_prefix_.empty() &&
                        end_of_word_suffix_.empty() && token_to_id(kWordMarker).has_value() &&
                        std::none_of(vocab_.begin(), vocab_.end(), [](const auto& entry) {
                          return marker_follows_text(entry.first);
                        });
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  return id < 0 || id >= vocab_size() ? nullptr : tokens_[id];
}

void BpeModel::take_raw_bytes() {
  raw_bytes_ = true;
  cut_at_word_marker_ = false;
  const auto& alphabet = byte_level_alphabet();
  raw_bytes_direct_ =
      !ignore_merges_ && continuing_subword_prefix_.empty() && end_of_word_suffix_.empty();
  for (int b = 0; b < 256; ++b) {
    byte_level_ids_[b] = token_to_id(alphabet[b]).value_or(-1);
    if (byte_level_ids_[b] < 0) raw_bytes_direct_ = false;
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& ids) const {
  if (!cut_at_word_marker_) {
    encode_piece(word, ids);
    return;
  }
  size_t start = 0;
  while (start < word.size()) {
    size_t end = start;
    while (word.substr(end).starts_with(kWordMarker)) end += kWordMarker.size();
    end = std::min(word.find(kWordMarker, end), word.size());
    encode_piece(word.substr(start, end - start), ids);
    start = end;
  }
}

void BpeModel::encode_piece(std::string_view word, std::vector<int32_t>& ids) const {
  const bool cacheable = word.size() <= WordCache::kMaxWordBytes;
  // 0 marks an empty cache slot.
  const uint64_t hash = std::hash<std::string_view>{}(word) | 1;
  if (cacheable && cache_.append(word, hash, ids)) return;
  const size_t first = ids.size();
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  if (raw_bytes_direct_) {
    for (const char c : word) symbols.push_back(byte_level_ids_[static_cast<unsigned char>(c)]);
  } else {
    std::string mapped;
    if (raw_bytes_) {
      const auto& alphabet = byte_level_alphabet();
      for (const char c : word) mapped += alphabet[static_cast<unsigned char>(c)];
    }
    const std::string_view text = raw_bytes_ ? std::string_view(mapped) : word;
    const auto whole = ignore_merges_ ? token_to_id(text) : std::nullopt;
    if (whole) {
      symbols.push_back(*whole);
    } else {
      initial_symbols(text, symbols);
    }
  }
  apply_merges(symbols);
  ids.insert(ids.end(), symbols.begin(), symbols.end());
  if (cacheable) cache_.insert(word, hash, std::span(ids).subspan(first));
}

// The 6 MiB of slots are made by the first insert, not here: a tokenizer that never encodes
// (detokenize; a file refused after its model loaded) need not zero them, and doing so was a
// quarter of fuzz_tokenizer_json's time.
BpeModel::WordCache::WordCache() = default;

bool BpeModel::WordCache::append(std::string_view word, uint64_t hash,
                                 std::vector<int32_t>& ids) const {
  std::shared_lock lock(mutex_);
  if (slots_.empty()) return false;
  for (size_t i = hash & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
    const Slot& slot = slots_[i];
    if (slot.hash == 0) return false;
    if (slot.hash == hash && slot.key_length == word.size() &&
        std::string_view(keys_).substr(slot.key_offset, slot.key_length) == word) {
      ids.insert(ids.end(), ids_.begin() + slot.ids_offset,
                 ids_.begin() + slot.ids_offset + slot.ids_length);
      return true;
    }
  }
}

void BpeModel::WordCache::insert(std::string_view word, uint64_t hash,
                                 std::span<const int32_t> word_ids) {
  std::unique_lock lock(mutex_);
  if (entries_ >= kMaxEntries || word_ids.size() > UINT16_MAX) return;
  if (slots_.empty()) slots_.resize(kSlots);
  size_t i = hash & (kSlots - 1);
  for (; slots_[i].hash != 0; i = (i + 1) & (kSlots - 1)) {
    if (slots_[i].hash == hash && slots_[i].key_length == word.size() &&
        std::string_view(keys_).substr(slots_[i].key_offset, slots_[i].key_length) == word) {
      return;  // another thread cached it first
    }
  }
  slots_[i] = Slot{hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()),
                   static_cast<uint8_t>(word.size()), static_cast<uint16_t>(word_ids.size())};
  keys_.append(word);
  ids_.insert(ids_.end(), word_ids.begin(), word_ids.end());
  ++entries_;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& ids) const {
  const bool plain = continuing_subword_prefix_.empty() && end_of_word_suffix_.empty();
  int32_t pending_unk = -1;  // an unk id waiting for unknown characters to fuse with
  std::string affixed;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t start = pos;
    const auto lead = static_cast<unsigned char>(word[pos]);
    pos += utf8_length(lead);
    std::optional<int32_t> id;
    if (plain) {
      size_t at = start;
      const char32_t c = next_code_point(word, at);
      if (c < 0x10000) {
        if (char_ids_[c] >= 0) id = char_ids_[c];
      } else {
        id = token_to_id(word.substr(start, pos - start));
      }
    } else {
      affixed.clear();
      if (start > 0) affixed += continuing_subword_prefix_;
      affixed.append(word.substr(start, pos - start));
      if (pos == word.size()) affixed += end_of_word_suffix_;
      id = token_to_id(affixed);
    }
    if (id) {
      if (pending_unk >= 0) ids.push_back(pending_unk);
      pending_unk = -1;
      ids.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      const std::string_view bytes = plain ? word.substr(start, pos - start) : affixed;
      const bool all_bytes = std::all_of(bytes.begin(), bytes.end(), [&](char c) {
        return byte_ids_[static_cast<unsigned char>(c)] >= 0;
      });
      if (all_bytes) {
        if (pending_unk >= 0) ids.push_back(pending_unk);
        pending_unk = -1;
        for (const char c : bytes) ids.push_back(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    // Without an unk token an unknown character is dropped, as Hugging Face does.
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) ids.push_back(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) ids.push_back(pending_unk);
}

const BpeModel::Merge* BpeModel::find_merge(int32_t left, int32_t right) const {
  return merges_.find(pair_key(left, right));
}

void BpeModel::MergeTable::reserve(size_t count) {
  size_t capacity = 16;
  shift_ = 60;
  while (capacity < 2 * count) {
    capacity *= 2;
    --shift_;
  }
  keys_.assign(capacity, kEmpty);
  merges_.assign(capacity, Merge{});
  mask_ = capacity - 1;
}

void BpeModel::MergeTable::insert_or_assign(uint64_t key, Merge merge) {
  size_t slot = index(key);
  while (keys_[slot] != kEmpty && keys_[slot] != key) slot = (slot + 1) & mask_;
  keys_[slot] = key;
  merges_[slot] = merge;
}

void BpeModel::apply_merges(std::vector<int32_t>& ids) const {
  const int n = static_cast<int>(ids.size());
  if (n < 2) return;
  struct Symbol {
    int32_t id;
    int prev, next;
    bool alive;
  };
  // Lowest rank first, then leftmost: the order in which Hugging Face applies merges.
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t result;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  // Scratch reused across words: most words are short, and allocating per word cost more than
  // merging them.
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbols.resize(n);
  heap.clear();
  const auto push = [&](Candidate c) {
    heap.push_back(c);
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int i = 0; i < n; ++i) symbols[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  for (int i = 0; i + 1 < n; ++i) {
    if (const Merge* m = find_merge(ids[i], ids[i + 1])) heap.push_back({m->rank, i, m->result});
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Skip entries made stale by an earlier merge of either symbol.
    const Merge* current = find_merge(left.id, right.id);
    if (current == nullptr || current->result != top.result) continue;
    left.id = top.result;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* m = find_merge(symbols[left.prev].id, left.id)) {
        push({m->rank, left.prev, m->result});
      }
    }
    if (left.next >= 0) {
      if (const Merge* m = find_merge(left.id, symbols[left.next].id)) {
        push({m->rank, top.pos, m->result});
      }
    }
  }
  ids.clear();
  for (int i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
}

}  // namespace ekva
