#include "io/row_spans.h"

#include <string>

#include "core/out_of_memory.h"
#include "qkv/error.h"

namespace qkv::io {
namespace {

std::string span_text(const RowSpan& span) {
  return "[" + std::to_string(span.first) + ", " + std::to_string(span.last) + ")";
}

}  // namespace

Tensor read_row_spans(const TensorInfo& info, std::uint64_t data_offset,
                      std::span<const RowSpan> spans, const ReadAt& read_at) {
  const std::size_t rank = info.shape.size();
  if (rank < 2) {
    throw Error(info.name,
                "has shape " + shape_string(info.shape) +
                    ": reading rows needs at least 2 dims (rows are the second-to-last)");
  }
  const std::int64_t rows = info.shape[rank - 2];
  std::int64_t kept = 0;
  std::int64_t end = 0;  // of the previous span
  for (const RowSpan& span : spans) {
    if (span.first < end || span.last < span.first || span.last > rows) {
      throw Error(info.name, "cannot read rows " + span_text(span) + " of its " +
                                 std::to_string(rows) +
                                 " (row spans must be ascending, disjoint and within the rows)");
    }
    kept += span.last - span.first;
    end = span.last;
  }
  Shape shape = info.shape;
  shape[rank - 2] = kept;
  Tensor part;
  try {
    part = Tensor(info.dtype, shape, info.name);
  } catch (const core::OutOfMemory& e) {
    throw Error(info.name, "out of memory reading " + e.allocation());
  }
  std::int64_t outer = 1;
  for (std::size_t i = 0; i + 2 < rank; ++i) outer *= info.shape[i];
  const auto row_bytes = static_cast<std::uint64_t>(dtype_size(info.dtype)) *
                         static_cast<std::uint64_t>(info.shape[rank - 1]);
  auto* to = static_cast<unsigned char*>(part.data());
  if (row_bytes > 0 && kept > 0) {
    for (std::int64_t o = 0; o < outer; ++o) {
      for (const RowSpan& span : spans) {
        const auto count = static_cast<std::uint64_t>(span.last - span.first) * row_bytes;
        if (count == 0) continue;
        const std::uint64_t at =
            data_offset + (static_cast<std::uint64_t>(o) * static_cast<std::uint64_t>(rows) +
                           static_cast<std::uint64_t>(span.first)) *
                              row_bytes;
        read_at(at, to, static_cast<std::size_t>(count));
        to += count;
      }
    }
  }
  if (info.dtype == DType::kBool) {
    const auto* values = static_cast<const unsigned char*>(part.data());
    for (std::uint64_t i = 0; i < part.nbytes(); ++i) {
      if (values[i] > 1) {
        throw Error(info.name, "a bool element among the rows read holds the byte " +
                                   std::to_string(values[i]) + "; bool data must be 0 or 1");
      }
    }
  }
  return part;
}

}  // namespace qkv::io
