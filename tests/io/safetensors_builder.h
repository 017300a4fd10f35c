// Writes .safetensors files for tests, byte by byte as the format defines them, including the
// dtypes qkv converts on load (F16, BF16) and files that break the rules on purpose.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "qkv/tensor.h"

namespace qkv::testing {

struct SafetensorsItem {
  std::string name;
  std::string dtype;  // "F32", "F16", ...
  Shape shape;
  std::string bytes;
  // Offsets to write instead of the computed ones (a hostile file), when set.
  std::string offsets_override;
};

inline std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The header JSON for `items` laid out back to back, without the length prefix.
inline std::string safetensors_header(const std::vector<SafetensorsItem>& items,
                                      const std::string& metadata_json = "") {
  std::string header = "{";
  bool first = true;
  if (!metadata_json.empty()) {
    header += "\"__metadata__\":" + metadata_json;
    first = false;
  }
  std::uint64_t offset = 0;
  for (const SafetensorsItem& item : items) {
    if (!first) header += ",";
    first = false;
    std::string shape;
    for (const std::int64_t dim : item.shape)
      shape += (shape.empty() ? "" : ",") + std::to_string(dim);
    const std::uint64_t end = offset + item.bytes.size();
    const std::string offsets = item.offsets_override.empty()
                                    ? "[" + std::to_string(offset) + "," + std::to_string(end) + "]"
                                    : item.offsets_override;
    header += json_string(item.name) + ":{\"dtype\":\"" + item.dtype + "\",\"shape\":[" + shape +
              "],\"data_offsets\":" + offsets + "}";
    offset = end;
  }
  return header + "}";
}

// A whole file: the 8-byte length, the header padded with spaces to a multiple of 8, the data.
inline std::string safetensors_bytes(const std::vector<SafetensorsItem>& items,
                                     const std::string& metadata_json = "") {
  std::string header = safetensors_header(items, metadata_json);
  while (header.size() % 8 != 0) header += ' ';
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  out += header;
  for (const SafetensorsItem& item : items) out += item.bytes;
  return out;
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// float to IEEE binary16 / bfloat16, rounding to nearest even (finite inputs in range).
inline std::uint16_t float_to_half(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const float a = std::fabs(f);
  if (a >= 65520.0f) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (a < 6.103515625e-05f) {  // subnormal half: a multiple of 2^-24
    const auto m = static_cast<std::uint32_t>(std::nearbyint(a * 16777216.0f));
    return static_cast<std::uint16_t>(sign | m);
  }
  const std::uint32_t ax = x & 0x7fffffffu;
  std::uint32_t mant = ax & 0x7fffffu;
  std::uint32_t exp = (ax >> 23) - 112;
  std::uint32_t h = (exp << 10) | (mant >> 13);
  const std::uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

inline std::uint16_t float_to_bfloat16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

// A float32 tensor stored as `dtype` ("F32", "F64", "F16" or "BF16").
inline SafetensorsItem safetensors_item(const std::string& name, const Tensor& t,
                                        const std::string& dtype) {
  const Tensor f = t.to(DType::kF64);
  const auto* values = f.data_as<double>();
  std::string bytes;
  const auto append = [&](const void* p, std::size_t n) {
    bytes.append(static_cast<const char*>(p), n);
  };
  for (std::int64_t i = 0; i < f.numel(); ++i) {
    const double v = values[i];
    if (dtype == "F64") {
      append(&v, 8);
    } else if (dtype == "F32") {
      const auto x = static_cast<float>(v);
      append(&x, 4);
    } else if (dtype == "F16") {
      const std::uint16_t h = float_to_half(static_cast<float>(v));
      append(&h, 2);
    } else {
      const std::uint16_t b = float_to_bfloat16(static_cast<float>(v));
      append(&b, 2);
    }
  }
  return {name, dtype, t.shape(), bytes, ""};
}

}  // namespace qkv::testing
