// Byte counts for messages, in one wording everywhere: "64 bytes", "3 KiB", "1.5 GiB".
#pragma once

#include <cstdint>
#include <string>

namespace qkv::core {

std::string format_bytes(std::uint64_t bytes);

}  // namespace qkv::core
