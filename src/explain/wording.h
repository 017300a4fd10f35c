// What the terminal and the page both say, from one source.
//
// Each phrase is a template: "{name}" is replaced by a value, and "{name|one|many}" by the
// value followed by the word that agrees with it ("1 allowed key", "2 allowed keys"; the value
// counts as one only when it is exactly "1"). format_walk_through() and format_overview() say
// their sentences through say(); the page receives the same table (phrases_json()) and its
// script's say() fills it by the same rules, so the two cannot drift apart.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkv::explain_detail {

using Values = std::vector<std::pair<std::string, std::string>>;

// The phrase `id` with its placeholders filled; throws std::logic_error for an unknown id or a
// placeholder without a value (a programming error, caught by the tests).
std::string say(std::string_view id, const Values& values = {});

// {"id": "template", ...} for the page.
std::string phrases_json();

// `value` with `digits` decimals, never "-0.0000" (a value that rounds to zero prints as
// zero), and "inf" / "-inf" for infinities. The page's fmt() follows the same rule.
std::string fixed(double value, int digits = 4);

// "1 key", "2 keys".
std::string count(std::int64_t n, std::string_view one, std::string_view many);

}  // namespace qkv::explain_detail
