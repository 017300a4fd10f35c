#include "cache/quantise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/half.h"

namespace qkv::cache {

float int8_block_scale(const float* values, std::int64_t count) noexcept {
  float amax = 0.0f;
  for (std::int64_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(values[i]));
  float scale = amax / 127.0f;
  // amax / 127 rounds up for amax = FLT_MAX, and 127 · scale, the value the block's largest
  // element is read back as, would pass FLT_MAX: inf to every float32 reader. One step down
  // keeps it finite (round(amax / scale) is still 127) and within half a scale of amax.
  if (127.0 * static_cast<double>(scale) > std::numeric_limits<float>::max()) {
    scale = std::nextafter(scale, 0.0f);
  }
  return scale;
}

std::int8_t int8_quantise(float value, float scale) noexcept {
  if (scale == 0.0f) return 0;
  // A subnormal scale may send value / scale to infinity; the clamp takes it back to ±127.
  const float q = std::clamp(std::round(value / scale), -127.0f, 127.0f);
  return static_cast<std::int8_t>(q);
}

void store_row(CacheStorage storage, const float* values, std::int64_t count, std::byte* row,
               float* scales) noexcept {
  switch (storage) {
    case CacheStorage::kF32:
      if (count > 0) std::memcpy(row, values, static_cast<std::size_t>(count) * sizeof(float));
      return;
    case CacheStorage::kBF16: {
      auto* out = reinterpret_cast<std::uint16_t*>(row);
      for (std::int64_t i = 0; i < count; ++i) out[i] = core::float_to_bf16(values[i]);
      return;
    }
    case CacheStorage::kF16: {
      auto* out = reinterpret_cast<std::uint16_t*>(row);
      for (std::int64_t i = 0; i < count; ++i) out[i] = core::float_to_f16(values[i]);
      return;
    }
    case CacheStorage::kInt8: {
      auto* out = reinterpret_cast<std::int8_t*>(row);
      for (std::int64_t begin = 0, b = 0; begin < count; begin += kCacheInt8Block, ++b) {
        const std::int64_t size = std::min(kCacheInt8Block, count - begin);
        const float scale = int8_block_scale(values + begin, size);
        scales[b] = scale;
        for (std::int64_t i = begin; i < begin + size; ++i) {
          out[i] = int8_quantise(values[i], scale);
        }
      }
      return;
    }
  }
}

void load_row(CacheStorage storage, const std::byte* row, const float* scales, std::int64_t count,
              double* out) noexcept {
  switch (storage) {
    case CacheStorage::kF32: {
      const auto* in = reinterpret_cast<const float*>(row);
      for (std::int64_t i = 0; i < count; ++i) out[i] = static_cast<double>(in[i]);
      return;
    }
    case CacheStorage::kBF16: {
      const auto* in = reinterpret_cast<const std::uint16_t*>(row);
      for (std::int64_t i = 0; i < count; ++i) out[i] = core::bf16_to_float(in[i]);
      return;
    }
    case CacheStorage::kF16: {
      const auto* in = reinterpret_cast<const std::uint16_t*>(row);
      for (std::int64_t i = 0; i < count; ++i) out[i] = core::f16_to_float(in[i]);
      return;
    }
    case CacheStorage::kInt8: {
      const auto* in = reinterpret_cast<const std::int8_t*>(row);
      for (std::int64_t i = 0; i < count; ++i) {
        out[i] = static_cast<double>(in[i]) * static_cast<double>(scales[i / kCacheInt8Block]);
      }
      return;
    }
  }
}

}  // namespace qkv::cache
