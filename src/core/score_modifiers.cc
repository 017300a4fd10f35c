#include "core/score_modifiers.h"

#include <cmath>

#include "qkv/attention.h"

namespace qkv::core {

// ALiBi's get_slopes: for a power of two n, slope_h = 2^(-8(h+1)/n); for other head counts the
// n = 2^floor(log2 H) slopes, then every other slope of 2n (the odd-numbered ones,
// 2^(-4(2k+1)/n)) until there are H.
std::vector<double> standard_alibi_slopes(std::int64_t heads) {
  std::vector<double> slopes;
  if (heads <= 0) return slopes;
  slopes.reserve(static_cast<std::size_t>(heads));
  std::int64_t n = 1;
  while (n * 2 <= heads) n *= 2;
  const double nd = static_cast<double>(n);
  for (std::int64_t h = 0; h < n; ++h) {
    slopes.push_back(std::exp2(-8.0 * static_cast<double>(h + 1) / nd));
  }
  for (std::int64_t k = 0; static_cast<std::int64_t>(slopes.size()) < heads; k += 2) {
    slopes.push_back(std::exp2(-8.0 * static_cast<double>(k + 1) / (2.0 * nd)));
  }
  return slopes;
}

}  // namespace qkv::core

namespace qkv {

std::vector<double> alibi_slopes(std::int64_t heads) { return core::standard_alibi_slopes(heads); }

}  // namespace qkv
