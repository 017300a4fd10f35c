// The row layouts of attention across processes (qkv/dist.h): which global rows each rank
// holds. Needs no MPI; compiled in every build.
#include <cstring>
#include <string>
#include <vector>

#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

// The first row of piece c when n rows are cut into `pieces` as evenly as integers allow.
std::int64_t piece_start(std::int64_t n, std::int64_t pieces, std::int64_t c) noexcept {
  // n · c may overflow for absurd n; split into quotient and remainder first.
  return (n / pieces) * c + (n % pieces) * c / pieces;
}

void check_rank(std::int64_t n, int ranks, int rank) {
  if (n < 0) throw Error("ring", "the row count must be >= 0, got " + std::to_string(n));
  if (ranks < 1) throw Error("ring", "the rank count must be >= 1, got " + std::to_string(ranks));
  if (rank < 0 || rank >= ranks) {
    throw Error("ring",
                "rank " + std::to_string(rank) + " is outside [0, " + std::to_string(ranks) + ")");
  }
}

}  // namespace

std::vector<RowRange> rank_rows(std::int64_t n, int ranks, int rank, RowLayout layout) {
  check_rank(n, ranks, rank);
  std::vector<RowRange> rows;
  const auto add = [&](std::int64_t pieces, std::int64_t c) {
    const RowRange r{piece_start(n, pieces, c), piece_start(n, pieces, c + 1)};
    if (r.size() > 0) rows.push_back(r);
  };
  if (layout == RowLayout::kContiguous) {
    add(ranks, rank);
  } else {
    const std::int64_t chunks = 2 * static_cast<std::int64_t>(ranks);
    add(chunks, rank);
    add(chunks, chunks - 1 - rank);
  }
  return rows;
}

std::int64_t rank_row_count(std::int64_t n, int ranks, int rank, RowLayout layout) {
  std::int64_t count = 0;
  for (const RowRange& r : rank_rows(n, ranks, rank, layout)) count += r.size();
  return count;
}

RowLayout default_layout(const AttentionOptions& options) {
  return options.causal || options.window ? RowLayout::kZigZag : RowLayout::kContiguous;
}

const char* layout_name(RowLayout layout) noexcept {
  return layout == RowLayout::kZigZag ? "zigzag" : "contiguous";
}

Tensor slice_rows(const TensorView& full, int axis, int ranks, int rank, RowLayout layout) {
  const int r = full.rank();
  const int a = axis < 0 ? axis + r : axis;
  if (a < 0 || a >= r) {
    throw Error(full.name, "has no axis " + std::to_string(axis) + " to split rows along");
  }
  const auto ua = static_cast<std::size_t>(a);
  const Tensor whole = contiguous_copy(full, full.dtype);
  const std::vector<RowRange> rows = rank_rows(full.shape[ua], ranks, rank, layout);
  Shape shape = full.shape;
  shape[ua] = 0;
  for (const RowRange& range : rows) shape[ua] += range.size();
  Tensor part(full.dtype, shape, full.name);
  // Rows are runs of `inner` elements; `outer` runs of the row axis.
  std::int64_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < ua; ++i) outer *= full.shape[i];
  for (std::size_t i = ua + 1; i < full.shape.size(); ++i) inner *= full.shape[i];
  const auto bytes = static_cast<std::int64_t>(dtype_size(full.dtype));
  const auto* from = static_cast<const char*>(whole.data());
  auto* to = static_cast<char*>(part.data());
  for (std::int64_t o = 0; o < outer; ++o) {
    for (const RowRange& range : rows) {
      const std::int64_t run = range.size() * inner * bytes;
      std::memcpy(to, from + (o * full.shape[ua] + range.first) * inner * bytes,
                  static_cast<std::size_t>(run));
      to += run;
    }
  }
  return part;
}

}  // namespace qkv::dist
