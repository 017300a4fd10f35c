// Reading explain's terminal text in tests: the header line that opens each row's walk-through.
#pragma once

#include <cstdint>
#include <regex>
#include <string>

namespace qkv::testing {

// "── query 3 \"label\", head 1, batch element 1 ──": the row and the head (0 when unnamed);
// the head is looked for after the label's closing quote.
inline bool parse_walk_through_header(const std::string& line, std::int64_t& row,
                                      std::int64_t& head) {
  static const std::regex start("^── query ([0-9]+)");
  static const std::regex head_part(", head ([0-9]+)");
  std::smatch m;
  if (!std::regex_search(line, m, start)) return false;
  row = std::stoll(m[1].str());
  const std::size_t quote = line.rfind('"');
  const std::string rest = quote == std::string::npos ? line : line.substr(quote);
  head = std::regex_search(rest, m, head_part) ? std::stoll(m[1].str()) : 0;
  return true;
}

}  // namespace qkv::testing
