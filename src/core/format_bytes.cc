#include "core/format_bytes.h"

#include <array>
#include <cstdio>
#include <limits>

namespace qkv::core {

std::string format_bytes(std::uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes");
  constexpr std::array<const char*, 6> kUnits = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kUnits.size()) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, value < 10.0 ? "%.3g %s" : "%.0f %s", value, kUnits[unit]);
  return text;
}

std::string format_bytes_exact(std::uint64_t bytes) {
  if (bytes == std::numeric_limits<std::uint64_t>::max()) return "more than 2^64 bytes";
  // Under 1 KiB the exact count already says it all: "512 bytes (512 B)", not "(512 bytes)".
  const std::string human = bytes < 1024 ? std::to_string(bytes) + " B" : format_bytes(bytes);
  return std::to_string(bytes) + " bytes (" + human + ")";
}

}  // namespace qkv::core
