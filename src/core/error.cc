#include "qkv/error.h"

#include <utility>

#include "core/out_of_memory.h"

namespace qkv {

Error::Error(std::string subject, std::string problem)
    : std::runtime_error(subject + ": " + problem),
      subject_(std::move(subject)),
      problem_(std::move(problem)) {}

namespace core {

OutOfMemory::OutOfMemory(std::string subject, std::string allocation, std::uint64_t bytes)
    : Error(std::move(subject), "out of memory allocating " + allocation),
      allocation_(std::move(allocation)),
      bytes_(bytes) {}

}  // namespace core

}  // namespace qkv
