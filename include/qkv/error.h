// qkv::Error: the one exception type of the library. It names its subject (a file, a tensor,
// an option) so that a caller can print one line that says what is wrong and where.
#pragma once

#include <stdexcept>
#include <string>

namespace qkv {

class Error : public std::runtime_error {
 public:
  Error(std::string subject, std::string problem);

  const std::string& subject() const noexcept { return subject_; }
  const std::string& problem() const noexcept { return problem_; }

 private:
  std::string subject_;
  std::string problem_;
};

// The library's version, e.g. "0.1.0".
const char* version() noexcept;

}  // namespace qkv
