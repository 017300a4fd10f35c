// The row conversions of the KV cache: float values into a page's storage type, and back out
// exactly into float64.
//
// f32 stores the value; bf16 and f16 round it to nearest even (core/half.h; a float64 input has
// been rounded to float first, so it goes f64 -> float -> 16-bit).
//
// int8 follows q8_0: a row of `count` values is cut into blocks of kCacheInt8Block = 32 (the
// last block is shorter when count % 32 != 0), and each block b keeps one float scale:
//   amax  = max |x| over the block, in float (x already rounded to float)
//   scale = amax / 127                        (float division; 0 for an all-zero block; one
//                                             float step lower when 127 · scale would pass
//                                             FLT_MAX, as it does for amax = FLT_MAX)
//   q     = round_half_away_from_zero(x / scale) clamped to [-127, 127]   (float division;
//           q = 0 for every value when scale == 0)
// and the stored value is q · scale, formed exactly in float64 as double(q) * double(scale)
// (an 8-bit integer times a float needs at most 32 significant bits). Its error is at most
// scale / 2 per value, plus the rounding of x / scale.
#pragma once

#include <cstddef>
#include <cstdint>

#include "qkv/kv_cache.h"

namespace qkv::cache {

float int8_block_scale(const float* values, std::int64_t count) noexcept;
std::int8_t int8_quantise(float value, float scale) noexcept;

// Writes one row of `count` values at `row` (count elements of the storage type) and, for int8,
// its ceil(count / 32) scales at `scales` (unused otherwise).
void store_row(CacheStorage storage, const float* values, std::int64_t count, std::byte* row,
               float* scales) noexcept;

// Reads one row back, dequantised exactly into float64.
void load_row(CacheStorage storage, const std::byte* row, const float* scales, std::int64_t count,
              double* out) noexcept;

}  // namespace qkv::cache
