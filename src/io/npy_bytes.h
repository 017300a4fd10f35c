// The bytes of an .npy file wherever they are: a file on disk (read_npy) or a member of an
// .npz archive (npz.cc), read through the one .npy parser and its checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "io/npy_dtype.h"
#include "qkv/io.h"

namespace qkv::io {

class NpyBytes {
 public:
  virtual ~NpyBytes() = default;
  // The number of bytes the .npy file holds; every length in its header is checked against it.
  virtual std::uint64_t size() const = 0;
  // Exactly `count` bytes at `offset`, within size(). The parser reads in increasing order of
  // offset (the first 12 bytes, the header from byte 8 or 10 on, then the data), which lets a
  // stream that cannot seek back serve it.
  virtual void read_at(std::uint64_t offset, void* buffer, std::size_t count) = 0;
};

// The header, validated as inspect_npy validates a file; `subject` names the bytes in errors.
TensorInfo inspect_npy_bytes(NpyBytes& bytes, const std::string& subject, NpyAccept accept);

// The tensor, validated and read as read_npy reads a file.
Tensor read_npy_bytes(NpyBytes& bytes, const std::string& subject, NpyAccept accept);

// Only the rows of `spans` along the second-to-last axis (read_tensor_rows), the header
// validated as read_npy_bytes validates it; the reads come in increasing order of offset.
Tensor read_npy_bytes_rows(NpyBytes& bytes, const std::string& subject, NpyAccept accept,
                           std::span<const RowSpan> spans);

}  // namespace qkv::io
