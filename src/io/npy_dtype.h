// The dtypes of .npy files ('descr' in the header): which each reader accepts, the one-line
// refusal of any other (naming the file, quoting the descr safely), and the descr to write.
#pragma once

#include <string>
#include <string_view>

#include "qkv/tensor.h"

namespace qkv::io {

// What a reader takes: the values of every tensor (read_npy: float32, float64, float16, bool),
// or the integer sequence offsets of a packed batch (read_npy_offsets: int32, int64), the one
// place integer files are read.
enum class NpyAccept { kValues, kOffsets };

// The dtype of `descr` for that reader; throws qkv::Error(subject, ...) for any other, with the
// fix when there is one (big-endian, an unstated byte order, float offsets).
DType npy_dtype_from_descr(const std::string& descr, const std::string& subject, NpyAccept accept);

// What the reader reads, as its refusals say it.
const char* npy_supported(NpyAccept accept) noexcept;

// The descr encode_npy writes for `dtype` ("?" for bfloat16, which NumPy lacks).
const char* npy_descr_of(DType dtype) noexcept;

// Text from a file, quoted as Python's repr would and made safe for a one-line message.
std::string quote_npy_text(std::string_view text);

}  // namespace qkv::io
