#include "byte_bpe.h"

#include <algorithm>
#include <atomic>
#include <queue>
#include <system_error>
#include <thread>

namespace byte_bpe {
namespace {

constexpr uint32_t kCodePoints = 0x110000;
constexpr size_t kCachedBytes = 256;  // longer pieces (rare, and costly to keep) are not cached

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

bool IsLineBreak(uint32_t c) { return c == '\r' || c == '\n'; }

// A contraction's letter as the case-insensitive pattern folds it (U+017F, long s, folds to s).
uint32_t Fold(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + ('a' - 'A');
  return c == 0x17F ? 's' : c;
}

void AppendUtf8(uint32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// `f` of a text's code units, as wide as a Python str of `kind` stores them (1, 2 or 4 bytes).
template <typename F>
bool ByKind(const void* data, int kind, F&& f) {
  switch (kind) {
    case 1:
      return f(static_cast<const uint8_t*>(data));
    case 2:
      return f(static_cast<const uint16_t*>(data));
    default:
      return f(static_cast<const uint32_t*>(data));
  }
}

struct Candidate {  // a merge to try: the pair starting at symbol `pos`
  int32_t rank;
  int32_t pos;
  int32_t merged;
  bool operator>(const Candidate& other) const {
    return rank != other.rank ? rank > other.rank : pos > other.pos;
  }
};

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool alive;
};

}  // namespace

Encoder::Encoder(int pattern, const int32_t* byte_ids, size_t n_merges, const int32_t* left,
                 const int32_t* right, const int32_t* merged, size_t cache_limit)
    : pattern_(static_cast<Pattern>(pattern)),
      max_digits_(pattern == kLlama3 ? 3 : 1),
      classes_(kCodePoints, kUnknown),
      cache_limit_(cache_limit) {
  for (int b = 0; b < 256; ++b) byte_ids_[b] = byte_ids[b];
  merges_.reserve(n_merges * 2);
  for (size_t i = 0; i < n_merges; ++i) {
    merges_[PairKey(left[i], right[i])] = {static_cast<int32_t>(i), merged[i]};
  }
}

void Encoder::SetClass(uint32_t code_point, uint8_t cls) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (code_point < kCodePoints) classes_[code_point] = cls;
}

void Encoder::AddWholeToken(const std::string& bytes, int32_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  whole_[bytes] = id;
}

void Encoder::EncodeMany(size_t n, const void* const* data, const int* kinds,
                         const size_t* lengths, std::vector<int32_t>* out, char* done,
                         int max_threads) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) total += lengths[i];
  const size_t asked = static_cast<size_t>(std::max(max_threads, 1));
  const size_t threads = std::max<size_t>(1, std::min({asked, n, total / kLengthPerThread}));
  if (workers_.size() < threads) workers_.resize(threads);
  // Texts are taken one at a time as threads come free: a thread that starts late (or whose
  // core is busy) takes fewer, and the caller never waits on more than the texts in hand.
  std::atomic<size_t> next{0};
  auto run = [&](Worker* worker) {
    std::vector<int32_t> ids;  // out[i] written once: its neighbours may be another thread's
    for (size_t i = next++; i < n; i = next++) {
      ids.clear();
      done[i] = ByKind(data[i], kinds[i], [&](auto text) {
        return EncodeText(text, lengths[i], &ids, worker);
      });
      if (done[i]) out[i].assign(ids.begin(), ids.end());
    }
  };
  std::vector<std::thread> helpers;
  for (size_t w = 1; w < threads; ++w) {
    try {
      helpers.emplace_back(run, &workers_[w]);
    } catch (const std::system_error&) {  // no more threads to be had: go on with these
      break;
    }
  }
  run(&workers_[0]);
  for (std::thread& helper : helpers) helper.join();
}

bool Encoder::Split(const void* data, int kind, size_t length, std::vector<size_t>* ends) {
  std::lock_guard<std::mutex> lock(mutex_);
  return ByKind(data, kind, [&](auto text) { return SplitText(text, length, ends); });
}

template <typename T>
bool Encoder::SplitText(const T* text, size_t length, std::vector<size_t>* ends) const {
  for (size_t i = 0; i < length; ++i) {
    if (ClassOf(text[i]) == kUnknown) return false;
  }
  for (size_t at = 0; at < length; at = ends->back()) ends->push_back(NextPiece(text, at, length));
  return true;
}

template <typename T>
bool Encoder::EncodeText(const T* text, size_t length, std::vector<int32_t>* out,
                         Worker* worker) {
  for (size_t i = 0; i < length; ++i) {
    if (ClassOf(text[i]) == kUnknown) return false;
  }
  std::string& piece = worker->piece;
  for (size_t at = 0; at < length;) {
    size_t end = NextPiece(text, at, length);
    piece.clear();
    for (size_t i = at; i < end; ++i) AppendUtf8(text[i], &piece);
    EncodePiece(piece, out, worker);
    at = end;
  }
  return true;
}

template <typename T>
size_t Encoder::NextPiece(const T* text, size_t at, size_t length) const {
  return pattern_ == kGpt2 ? Gpt2Piece(text, at, length) : Qwen2Piece(text, at, length);
}

// The end of the run of `cls` code points from `from`, at most `stop`.
template <typename T>
size_t Encoder::RunEnd(const T* text, size_t from, size_t stop, uint8_t cls) const {
  while (from < stop && ClassOf(text[from]) == cls) ++from;
  return from;
}

// The end of a whitespace run's match under `\s+(?!\S)|\s+`: the run but its last code point
// when something other than whitespace follows it (and the run is longer than one).
template <typename T>
size_t Encoder::SpaceEnd(const T* text, size_t from, size_t length) const {
  const size_t end = RunEnd(text, from, length, kSpace);
  return (end < length && end - from > 1) ? end - 1 : end;
}

template <typename T>
size_t Encoder::Gpt2Piece(const T* text, size_t at, size_t length) const {
  const uint32_t c = text[at];
  const uint32_t next = at + 1 < length ? text[at + 1] : 0;
  if (c == '\'' && at + 1 < length) {  // 's|'t|'re|'ve|'m|'ll|'d
    if (next == 's' || next == 't' || next == 'm' || next == 'd') return at + 2;
    if (at + 2 < length) {
      const uint32_t third = text[at + 2];
      if ((next == 'r' || next == 'v') && third == 'e') return at + 3;
      if (next == 'l' && third == 'l') return at + 3;
    }
  }
  const uint8_t cls = ClassOf(c);
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: a space joins a run of anything else
  if (c == ' ' && at + 1 < length && ClassOf(next) != kSpace) {
    return RunEnd(text, at + 1, length, ClassOf(next));
  }
  if (cls != kSpace) return RunEnd(text, at, length, cls);
  return SpaceEnd(text, at, length);
}

template <typename T>
size_t Encoder::Qwen2Piece(const T* text, size_t at, size_t length) const {
  const uint32_t c = text[at];
  const uint32_t next = at + 1 < length ? text[at + 1] : 0;
  if (c == '\'' && at + 1 < length) {  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    const uint32_t second = Fold(next);
    if (second == 's' || second == 't' || second == 'm' || second == 'd') return at + 2;
    if (at + 2 < length) {
      const uint32_t third = Fold(text[at + 2]);
      if ((second == 'r' || second == 'v') && third == 'e') return at + 3;
      if (second == 'l' && third == 'l') return at + 3;
    }
  }
  const uint8_t cls = ClassOf(c);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (cls == kLetter) return RunEnd(text, at, length, kLetter);
  if (cls != kNumber && !IsLineBreak(c) && at + 1 < length && ClassOf(next) == kLetter) {
    return RunEnd(text, at + 1, length, kLetter);
  }
  // \p{N} or \p{N}{1,3}
  if (cls == kNumber) return RunEnd(text, at, std::min(length, at + max_digits_), kNumber);
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  size_t other = at;
  if (c == ' ' && at + 1 < length && ClassOf(next) == kOther) other = at + 1;
  if (ClassOf(text[other]) == kOther) {
    size_t end = RunEnd(text, other, length, kOther);
    while (end < length && IsLineBreak(text[end])) ++end;
    return end;
  }
  // `\s*[\r\n]+`: through the run's last line break
  const size_t run = RunEnd(text, at, length, kSpace);
  for (size_t e = run; e > at; --e) {
    if (IsLineBreak(text[e - 1])) return e;
  }
  return SpaceEnd(text, at, length);
}

void Encoder::EncodePiece(const std::string& bytes, std::vector<int32_t>* out, Worker* worker) {
  if (!whole_.empty()) {
    auto whole = whole_.find(bytes);
    if (whole != whole_.end()) {
      out->push_back(whole->second);
      return;
    }
  }
  auto& cache = worker->cache;
  auto found = cache.find(bytes);
  if (found != cache.end()) {
    out->insert(out->end(), found->second.begin(), found->second.end());
    return;
  }
  std::vector<int32_t> ids;
  Merge(bytes, &ids);
  out->insert(out->end(), ids.begin(), ids.end());
  if (bytes.size() > kCachedBytes) return;
  if (cache.size() >= cache_limit_) cache.clear();
  cache.emplace(bytes, std::move(ids));
}

// The reference's `Word::merge_all`: the lowest-ranked pair merges first, the leftmost of equal
// ranks; a candidate whose pair changed since it was queued is dropped.
void Encoder::Merge(const std::string& bytes, std::vector<int32_t>* ids) const {
  std::vector<Symbol> symbols;
  symbols.reserve(bytes.size());
  for (char byte : bytes) {  // a byte without a token is left out, as the reference does
    const int32_t id = byte_ids_[static_cast<uint8_t>(byte)];
    if (id >= 0) symbols.push_back({id, static_cast<int32_t>(symbols.size()) - 1, -1, true});
  }
  const int32_t n = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i + 1 < n; ++i) symbols[i].next = i + 1;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push = [&](int32_t pos) {
    if (pos < 0 || symbols[pos].next < 0) return;
    auto m = merges_.find(PairKey(symbols[pos].id, symbols[symbols[pos].next].id));
    if (m != merges_.end()) queue.push({m->second.first, pos, m->second.second});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    auto m = merges_.find(PairKey(left.id, right.id));
    if (m == merges_.end() || m->second.second != top.merged) continue;
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    push(left.prev);
    push(top.pos);
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace byte_bpe
