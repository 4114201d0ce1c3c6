// Byte-level BPE encoding (GPT-2's scheme) of Python strings, exact to the `tokenizers` library.
//
// A text is split into pieces by a pre-tokenizer pattern written out by hand (the regex's
// alternatives in order, over per-code-point classes), and each piece's UTF-8 bytes are merged
// by rank exactly as `tokenizers`' BPE model merges them (lowest rank first, leftmost on a tie).
// Pieces' ids are cached. Code point classes (letter, number, whitespace, other) are given from
// outside, learnt from the reference's own regex engine, so a code point never seen is reported,
// not guessed.
#ifndef NATIVE_BYTE_BPE_H_
#define NATIVE_BYTE_BPE_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace byte_bpe {

enum Class : uint8_t { kUnknown = 0, kLetter = 1, kNumber = 2, kSpace = 3, kOther = 4 };

// The pre-tokenizer regexes written out:
// kGpt2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// kQwen2: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//         \s*[\r\n]+|\s+(?!\S)|\s+
// kLlama3: kQwen2 with \p{N}{1,3} for \p{N}
enum Pattern : int { kGpt2 = 0, kQwen2 = 1, kLlama3 = 2 };

// Every public method holds one mutex: an encoder may be shared by threads.
class Encoder {
 public:
  // pattern: a Pattern. byte_ids: the id of each single byte's token, i32[256] (-1: none, the
  // byte is dropped). merges: the ranked merge list as three i32[n] arrays (left id, right id,
  // merged id), rank = index (a pair listed twice ranks at its last place, as in the reference).
  // cache_limit: pieces whose ids each thread keeps (its cache is emptied when full).
  Encoder(int pattern, const int32_t* byte_ids, size_t n_merges, const int32_t* left,
          const int32_t* right, const int32_t* merged, size_t cache_limit);

  void SetClass(uint32_t code_point, uint8_t cls);

  // `ignore_merges`: a piece that is a whole token is that token, before any merge.
  void AddWholeToken(const std::string& bytes, int32_t id);

  // Appends the ids of text i, of lengths[i] code points each kinds[i] bytes wide (1, 2 or 4, as
  // a Python str stores them), to out[i]; done[i] false, with out[i] as it was, when a code
  // point's class is unknown. On up to `max_threads` threads (the caller's among them),
  // kLengthPerThread code points a thread at least (a thread's start costs about what encoding
  // a few hundred code points does).
  void EncodeMany(size_t n, const void* const* data, const int* kinds, const size_t* lengths,
                  std::vector<int32_t>* out, char* done, int max_threads);
  static constexpr size_t kLengthPerThread = 16384;

  // The pre-tokenizer's pieces of a text as `EncodeMany` takes it: each piece's end, in code
  // points. False, with `ends` as it was, when a code point's class is unknown.
  bool Split(const void* data, int kind, size_t length, std::vector<size_t>* ends);

 private:
  // A thread's own piece cache (piece bytes -> ids) and scratch piece: `EncodeMany`'s threads
  // share nothing they write, not even a cache line (two workers in one line ran two threads
  // slower than one).
  struct alignas(64) Worker {
    std::unordered_map<std::string, std::vector<int32_t>> cache;
    std::string piece;
  };

  template <typename T>
  bool EncodeText(const T* text, size_t length, std::vector<int32_t>* out, Worker* worker);
  template <typename T>
  bool SplitText(const T* text, size_t length, std::vector<size_t>* ends) const;
  template <typename T>
  size_t NextPiece(const T* text, size_t at, size_t length) const;
  template <typename T>
  size_t Gpt2Piece(const T* text, size_t at, size_t length) const;
  template <typename T>
  size_t Qwen2Piece(const T* text, size_t at, size_t length) const;
  template <typename T>
  size_t RunEnd(const T* text, size_t from, size_t stop, uint8_t cls) const;
  template <typename T>
  size_t SpaceEnd(const T* text, size_t from, size_t length) const;
  uint8_t ClassOf(uint32_t code_point) const {
    return code_point < classes_.size() ? classes_[code_point] : kOther;
  }
  void EncodePiece(const std::string& bytes, std::vector<int32_t>* out, Worker* worker);
  void Merge(const std::string& bytes, std::vector<int32_t>* ids) const;

  Pattern pattern_;
  size_t max_digits_;  // digits in one piece (kQwen2, kLlama3)
  std::vector<uint8_t> classes_;  // u8[0x110000], Class per code point
  int32_t byte_ids_[256];
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // pair -> (rank, merged)
  std::unordered_map<std::string, int32_t> whole_;  // token bytes -> id, with ignore_merges
  size_t cache_limit_;  // per worker
  std::vector<Worker> workers_;  // one per thread of `EncodeMany`, [0] the caller's
  std::mutex mutex_;
};

}  // namespace byte_bpe

#endif  // NATIVE_BYTE_BPE_H_
