// Helpers shared by the fuzz targets.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv::fuzz {

// The fuzz input as a file, without touching a disk: an anonymous memory file (memfd) whose
// /proc/self/fd path the readers open like any regular file.
class MemoryFile {
 public:
  MemoryFile(const void* data, std::size_t size) {
    fd_ = ::memfd_create("qkv-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) die("memfd_create failed");
    const auto* bytes = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t wrote = ::write(fd_, bytes, size);
      if (wrote <= 0) die("write to memfd failed");
      bytes += wrote;
      size -= static_cast<std::size_t>(wrote);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  const std::string& path() const noexcept { return path_; }

 private:
  [[noreturn]] static void die(const char* what) {
    std::fprintf(stderr, "fuzz: %s\n", what);
    std::abort();
  }
  int fd_ = -1;
  std::string path_;
};

// A finding: print it and abort, so that libFuzzer (or the replay driver) reports the input.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
  std::abort();
}

// Every error the library reports must be one printable line.
inline void check_one_line(const char* message) {
  if (std::strchr(message, '\n') != nullptr || std::strchr(message, '\r') != nullptr) {
    fail(std::string("multi-line error message: ") + message);
  }
  if (*message == '\0') fail("empty error message");
}

// The row reader (read_npy_rows and the like) on a tensor that read whole as `whole`: the rows
// [0, r/3) and [r/2, r) of its r rows (the second-to-last axis) must read, and equal those rows
// of `whole`.
template <class ReadRows>
void check_rows(const Tensor& whole, ReadRows&& read_rows) {
  const Shape& shape = whole.shape();
  if (shape.size() < 2) return;
  const std::int64_t rows = shape[shape.size() - 2];
  const std::vector<RowSpan> spans = {{0, rows / 3}, {rows / 2, rows}};
  Tensor part;
  try {
    part = read_rows(std::span<const RowSpan>(spans));
  } catch (const Error& e) {
    fail(std::string("reading rows refused a tensor that reads whole: ") + e.what());
  }
  const std::size_t row_bytes = dtype_size(whole.dtype()) * static_cast<std::size_t>(shape.back());
  const auto* from = static_cast<const char*>(whole.data());
  const auto* got = static_cast<const char*>(part.data());
  const std::int64_t kept = rows / 3 + (rows - rows / 2);
  // An empty tensor can have ~2^62 outer rows (shape (2^62, 0, 5)): the loop below would take
  // hours comparing nothing, so only the size is checked then.
  if (whole.nbytes() == 0) {
    if (part.nbytes() != 0) fail("read_tensor_rows gave bytes for rows of an empty tensor");
    return;
  }
  std::int64_t outer = 1;
  for (std::size_t i = 0; i + 2 < shape.size(); ++i) outer *= shape[i];
  if (part.nbytes() != static_cast<std::size_t>(outer * kept) * row_bytes) {
    fail("read_tensor_rows gave a tensor of the wrong size");
  }
  for (std::int64_t o = 0; o < outer; ++o) {
    for (const RowSpan& span : spans) {
      const std::size_t bytes = static_cast<std::size_t>(span.last - span.first) * row_bytes;
      if (bytes == 0) continue;
      if (std::memcmp(got, from + static_cast<std::size_t>(o * rows + span.first) * row_bytes,
                      bytes) != 0) {
        fail("read_tensor_rows differs from the same rows of the whole tensor");
      }
      got += bytes;
    }
  }
}

}  // namespace qkv::fuzz
