// Shared-prefix groups of token sequences for the packed batch (DESIGN §3), on sorted order.
//
// The sequences' tails (each without the prefix every sequence shares, and without its last
// token, which a member must keep to be scored) are sorted; adjacent tails' common prefixes then
// describe their radix tree without building it: every node is a range of sorted positions whose
// adjacent common prefixes are all at least the node's depth. One pass with a stack of the open
// nodes visits them bottom-up, where each node's sequences either stay one group, saving
// (n - 1) * depth tokens, or split among its children, whichever saves more (one group on ties).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

namespace prefix_groups {

// A sequence's tokens, int32[size] at data (not owned).
struct Span {
  const int32_t* data;
  int64_t size;
};

// Groups ordered by their first member: group g is members[offsets[g]:offsets[g + 1]],
// ascending, sharing prefix[g] tokens (0 for a sequence in no group).
struct Grouping {
  std::vector<int64_t> prefix;
  std::vector<int64_t> offsets;
  std::vector<int64_t> members;
};

// Length of the common prefix of a[:n] and b[:n].
inline int64_t common(const int32_t* a, const int32_t* b, int64_t n) {
  if (n <= 0) return 0;
  if (std::memcmp(a, b, n * sizeof(int32_t)) == 0) return n;  // a shared prompt: vectorised
  int64_t k = 0;
  while (a[k] == b[k]) ++k;
  return k;
}

// How many leading tokens all of `seqs` share, each keeping at least its last token.
inline int64_t shared_prefix(const std::vector<Span>& seqs) {
  if (seqs.empty()) return 0;
  int64_t limit = seqs[0].size;
  for (const Span& s : seqs) limit = std::min(limit, s.size);
  limit -= 1;
  for (const Span& s : seqs) {
    if (limit <= 0) return 0;
    limit = common(seqs[0].data, s.data, limit);
  }
  return std::max<int64_t>(limit, 0);
}

namespace detail {

struct Open {  // a node whose range is still growing
  int64_t depth;  // tokens below the shared prefix
  int64_t first;  // its first sorted position
  int64_t count = 0;  // sequences below it so far
  int64_t split = 0;  // tokens its children's plans save so far
};

struct Whole {  // a node whose sequences stay one group: sorted positions [first, last]
  int64_t prefix;
  int64_t first;
  int64_t last;
};

inline std::vector<int64_t> sorted_order(const std::vector<Span>& tails) {
  std::vector<int64_t> order(tails.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const Span& x = tails[a];
    const Span& y = tails[b];
    return std::lexicographical_compare(x.data, x.data + x.size, y.data, y.data + y.size);
  });
  return order;
}

// The whole nodes, children before parents.
inline std::vector<Whole> whole_nodes(const std::vector<Span>& tails,
                                      const std::vector<int64_t>& order, int64_t shared) {
  const int64_t n = static_cast<int64_t>(order.size());
  std::vector<Open> open{{0, 0}};  // the root: what every tail shares is empty
  std::vector<Whole> whole;
  auto lcp = [&](int64_t k) {  // of sorted positions k and k + 1
    const Span& a = tails[order[k]];
    const Span& b = tails[order[k + 1]];
    return common(a.data, b.data, std::min(a.size, b.size));
  };
  for (int64_t k = 0; k < n; ++k) {
    // the subtree handed up: leaf k, then each node it closes
    int64_t count = 1, saved = 0, first = k;
    const int64_t next = k + 1 < n ? lcp(k) : -1;  // -1 closes the root too
    while (!open.empty() && open.back().depth > next) {
      Open node = open.back();
      open.pop_back();
      node.count += count;
      node.split += saved;
      const int64_t prefix = shared + node.depth;
      const int64_t together = (node.count - 1) * prefix;
      const bool one_group = node.count > 1 && prefix > 0 && together >= node.split;
      if (one_group) whole.push_back({prefix, node.first, k});
      count = node.count;
      saved = one_group ? together : node.split;
      first = node.first;
    }
    if (next < 0) break;
    if (open.back().depth < next) open.push_back({next, first});
    open.back().count += count;
    open.back().split += saved;
  }
  return whole;
}

}  // namespace detail

// The groups of sequences whose `tails` follow `shared` common tokens.
inline Grouping group(const std::vector<Span>& tails, int64_t shared) {
  const int64_t n = static_cast<int64_t>(tails.size());
  const std::vector<int64_t> order = detail::sorted_order(tails);
  const std::vector<detail::Whole> whole = detail::whole_nodes(tails, order, shared);
  std::vector<std::vector<int64_t>> groups;
  std::vector<int64_t> prefixes;
  std::vector<char> grouped(n, 0);
  for (auto it = whole.rbegin(); it != whole.rend(); ++it) {  // parents first
    if (grouped[it->first]) continue;  // inside a group already
    std::vector<int64_t> members(order.begin() + it->first, order.begin() + it->last + 1);
    std::sort(members.begin(), members.end());
    std::fill(grouped.begin() + it->first, grouped.begin() + it->last + 1, 1);
    groups.push_back(std::move(members));
    prefixes.push_back(it->prefix);
  }
  for (int64_t k = 0; k < n; ++k) {
    if (!grouped[k]) {
      groups.push_back({order[k]});
      prefixes.push_back(0);
    }
  }
  std::vector<int64_t> by_first(groups.size());
  std::iota(by_first.begin(), by_first.end(), 0);
  std::sort(by_first.begin(), by_first.end(),
            [&](int64_t a, int64_t b) { return groups[a][0] < groups[b][0]; });
  Grouping out;
  out.offsets.push_back(0);
  for (int64_t g : by_first) {
    out.prefix.push_back(prefixes[g]);
    out.members.insert(out.members.end(), groups[g].begin(), groups[g].end());
    out.offsets.push_back(static_cast<int64_t>(out.members.size()));
  }
  return out;
}

}  // namespace prefix_groups
