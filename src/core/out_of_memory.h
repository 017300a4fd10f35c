// An allocation that failed, as a qkv::Error that also says what was being allocated.
//
// The Tensor constructor throws it (subject: the tensor's name). Code higher up that knows what
// it was doing — a reader filling the tensor from a file, the CLI running a command, the CLI
// encoding an output — catches it and says that instead ("q.npy: out of memory reading ...",
// "attention: out of memory allocating output: ..."), so that a failed allocation is one line
// naming its subject wherever it happens, never a bare std::bad_alloc.
#pragma once

#include <cstdint>
#include <string>

#include "qkv/error.h"

namespace qkv::core {

class OutOfMemory : public Error {
 public:
  // `allocation` says what was asked for: "2147483648 bytes (2 GiB) for a float32 tensor
  // [8192, 65536]"; the problem reads "out of memory allocating " + allocation.
  OutOfMemory(std::string subject, std::string allocation, std::uint64_t bytes);

  const std::string& allocation() const noexcept { return allocation_; }
  std::uint64_t bytes() const noexcept { return bytes_; }

 private:
  std::string allocation_;
  std::uint64_t bytes_ = 0;
};

}  // namespace qkv::core
