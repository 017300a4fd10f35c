// The explain page's JSON and base64 writers (see page_json.h).
#include "explain/page_json.h"

#include <cmath>
#include <cstdio>

namespace qkv::explain_detail {

std::string base64(const void* data, std::size_t size) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* bytes = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < size; i += 3) {
    const unsigned v = (unsigned{bytes[i]} << 16) | (unsigned{bytes[i + 1]} << 8) | bytes[i + 2];
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < size) {
    const unsigned v =
        (unsigned{bytes[i]} << 16) | (i + 1 < size ? unsigned{bytes[i + 1]} << 8 : 0u);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < size ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string b64_f64(const std::vector<double>& values) {
  return base64(values.data(), values.size() * sizeof(double));
}

std::string b64_f32(const double* values, std::size_t count) {
  const std::vector<float> narrow(values, values + count);
  return base64(narrow.data(), narrow.size() * sizeof(float));
}

std::string b64_f32(const std::vector<double>& values) {
  return b64_f32(values.data(), values.size());
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '<') {
      out += "\\u003c";
    } else if (u < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", u);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

std::string json_int(std::int64_t value) { return std::to_string(value); }

std::string json_strings(const std::vector<std::string>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += ',';
    out += json_string(values[i]);
  }
  return out + "]";
}

std::string json_numbers(const std::vector<double>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += ',';
    out += json_number(values[i]);
  }
  return out + "]";
}

std::string json_optional_strings(const std::vector<std::string>& values) {
  return values.empty() ? std::string("null") : json_strings(values);
}

}  // namespace qkv::explain_detail
