// Reading some rows of a stored tensor (read_tensor_rows, io.h): the one check of the spans and
// the one loop that reads them, shared by the .npy, .npz and safetensors readers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "qkv/io.h"

namespace qkv::io {

// Reads exactly `count` bytes at `offset`; calls come in increasing order of offset, so that a
// stream which cannot seek back (an inflated .npz member) can serve them.
using ReadAt = std::function<void(std::uint64_t offset, void* buffer, std::size_t count)>;

// The tensor of `info` (dtype and shape; a C-order layout starting at `data_offset`) with only
// the rows of `spans` along its second-to-last axis, read through `read_at`; bool elements are
// checked to be 0 or 1 as the whole-tensor readers check them. Throws qkv::Error naming
// info.name when the tensor has fewer than 2 dims or the spans are not ascending,
// non-overlapping and within its rows.
Tensor read_row_spans(const TensorInfo& info, std::uint64_t data_offset,
                      std::span<const RowSpan> spans, const ReadAt& read_at);

}  // namespace qkv::io
