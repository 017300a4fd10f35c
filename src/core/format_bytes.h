// Byte counts for messages, in one wording everywhere: "64 bytes", "3 KiB", "1.5 GiB".
#pragma once

#include <cstdint>
#include <string>

namespace qkv::core {

std::string format_bytes(std::uint64_t bytes);

// "17179869184 bytes (16 GiB)", "512 bytes (512 B)"; UINT64_MAX (a saturated sum) as "more than
// 2^64 bytes".
std::string format_bytes_exact(std::uint64_t bytes);

}  // namespace qkv::core
