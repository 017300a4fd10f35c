// The wait limit of src/dist (qkv/dist.h): QKV_RING_TIMEOUT, read where it is used. Needs no
// MPI; compiled in every build.
#include <cmath>
#include <cstdlib>
#include <string>

#include "qkv/dist.h"

namespace qkv::dist {
namespace {

constexpr double kDefaultWaitLimit = 300.0;

// QKV_RING_TIMEOUT as seconds (the default when unset or empty), or -1 when it is set but not
// a finite number > 0.
double parsed_wait_limit(const char* text) {
  if (text == nullptr || text[0] == '\0') return kDefaultWaitLimit;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(seconds > 0) || !std::isfinite(seconds)) return -1;
  return seconds;
}

}  // namespace

double wait_limit_seconds() {
  const double seconds = parsed_wait_limit(std::getenv("QKV_RING_TIMEOUT"));
  return seconds > 0 ? seconds : kDefaultWaitLimit;
}

std::string wait_limit_problem() {
  const char* text = std::getenv("QKV_RING_TIMEOUT");
  if (parsed_wait_limit(text) > 0) return {};
  return std::string("QKV_RING_TIMEOUT: expected a number of seconds > 0, got '") + text + "'";
}

}  // namespace qkv::dist
