// The small JSON and base64 writers the explain page's data block is made with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace qkv::explain_detail {

// Little-endian bytes in base64: the page reads them back as JS typed arrays.
std::string base64(const void* data, std::size_t size);
std::string b64_f64(const std::vector<double>& values);
std::string b64_f32(const std::vector<double>& values);
std::string b64_f32(const double* values, std::size_t count);

// A JSON string, safe inside <script>: '<' is escaped so that no "</script>" can close it.
std::string json_string(const std::string& text);
std::string json_number(double value);  // null for inf and NaN (JSON has neither)
std::string json_int(std::int64_t value);
std::string json_strings(const std::vector<std::string>& values);
std::string json_numbers(const std::vector<double>& values);
// null for an empty list: the page then names coordinates c0, c1, ...
std::string json_optional_strings(const std::vector<std::string>& values);

// Bytes of base64 text for `bytes` raw bytes.
constexpr std::int64_t base64_size(std::int64_t bytes) { return (bytes + 2) / 3 * 4; }

}  // namespace qkv::explain_detail
