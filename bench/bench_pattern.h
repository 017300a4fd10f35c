// The inputs every Google Benchmark program here times: float32 tensors holding a cheap
// deterministic pattern in [-1, 1) (the same values as `qkv bench`'s, seed for seed).
#pragma once

#include <cstdint>

#include "qkv/tensor.h"

namespace qkv::bench {

inline qkv::Tensor pattern(const qkv::Shape& shape, std::uint64_t seed) {
  qkv::Tensor t(qkv::DType::kF32, shape);
  float* x = t.data_as<float>();
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = static_cast<float>(static_cast<double>(state >> 40) / 16777216.0) * 2.0f - 1.0f;
  }
  return t;
}

}  // namespace qkv::bench
