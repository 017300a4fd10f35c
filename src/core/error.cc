#include "qkv/error.h"

#include <utility>

namespace qkv {

Error::Error(std::string subject, std::string problem)
    : std::runtime_error(subject + ": " + problem),
      subject_(std::move(subject)),
      problem_(std::move(problem)) {}

}  // namespace qkv
