#include "support/test_support.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>

#include "core/half.h"

namespace qkv::testing {

Tensor random_tensor(DType dtype, const Shape& shape, std::uint64_t seed, double lo, double hi) {
  Tensor t(dtype, shape, "random");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double x = dist(rng);
    switch (dtype) {
      case DType::kF32:
        t.data_as<float>()[i] = static_cast<float>(x);
        break;
      case DType::kF64:
        t.data_as<double>()[i] = x;
        break;
      case DType::kBool:
        t.data_as<bool>()[i] = x > (lo + hi) / 2;
        break;
      case DType::kBF16:
        t.data_as<std::uint16_t>()[i] = core::float_to_bf16(static_cast<float>(x));
        break;
      case DType::kF16:
        t.data_as<std::uint16_t>()[i] = core::float_to_f16(static_cast<float>(x));
        break;
      case DType::kI32:
        t.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(x);
        break;
      case DType::kI64:
        t.data_as<std::int64_t>()[i] = static_cast<std::int64_t>(x);
        break;
    }
  }
  return t;
}

double element(const TensorView& view, std::int64_t flat_index) {
  std::int64_t offset = 0;
  for (int axis = view.rank() - 1; axis >= 0; --axis) {
    const auto a = static_cast<std::size_t>(axis);
    offset += (flat_index % view.shape[a]) * view.strides[a];
    flat_index /= view.shape[a];
  }
  switch (view.dtype) {
    case DType::kF32:
      return static_cast<const float*>(view.data)[offset];
    case DType::kF64:
      return static_cast<const double*>(view.data)[offset];
    case DType::kBool:
      return static_cast<const bool*>(view.data)[offset] ? 1.0 : 0.0;
    case DType::kBF16:
      return core::bf16_to_float(static_cast<const std::uint16_t*>(view.data)[offset]);
    case DType::kF16:
      return core::f16_to_float(static_cast<const std::uint16_t*>(view.data)[offset]);
    case DType::kI32:
      return static_cast<const std::int32_t*>(view.data)[offset];
    case DType::kI64:
      return static_cast<double>(static_cast<const std::int64_t*>(view.data)[offset]);
  }
  return 0.0;
}

double max_abs_diff(const TensorView& a, const TensorView& b) {
  if (a.shape != b.shape) return std::numeric_limits<double>::infinity();
  double worst = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = element(a, i);
    const double y = element(b, i);
    if (std::isnan(x) != std::isnan(y)) return std::numeric_limits<double>::infinity();
    if (x == y) continue;  // also equal infinities
    worst = std::max(worst, std::fabs(x - y));
  }
  return worst;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

CausalAttention64 causal_attention_f64(const Tensor& q, const Tensor& k, const Tensor& v) {
  const std::int64_t h_count = q.shape()[0], nq = q.shape()[1], d = q.shape()[2];
  const std::int64_t nk = k.shape()[1], dv = v.shape()[2];
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  CausalAttention64 result;
  for (std::int64_t h = 0; h < h_count; ++h) {
    for (std::int64_t i = 0; i < nq; ++i) {
      const std::int64_t last = i + (nk - nq);
      std::vector<double> s(static_cast<std::size_t>(last + 1));
      double m = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j <= last; ++j) {
        double dot = 0.0;
        for (std::int64_t c = 0; c < d; ++c) {
          dot += element(q.view(), (h * nq + i) * d + c) * element(k.view(), (h * nk + j) * d + c);
        }
        s[static_cast<std::size_t>(j)] = dot * scale;
        m = std::max(m, dot * scale);
      }
      double sum = 0.0;
      for (double& x : s) sum += (x = std::exp(x - m));
      for (std::int64_t c = 0; c < dv; ++c) {
        double o = 0.0;
        for (std::int64_t j = 0; j <= last; ++j) {
          o += s[static_cast<std::size_t>(j)] / sum * element(v.view(), (h * nk + j) * dv + c);
        }
        result.out.push_back(o);
      }
      result.lse.push_back(m + std::log(sum));
    }
  }
  return result;
}

double max_abs_diff(const std::vector<double>& a, const Tensor& b) {
  if (static_cast<std::int64_t>(a.size()) != b.numel()) return std::numeric_limits<double>::infinity();
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - element(b.view(), static_cast<std::int64_t>(i))));
  }
  return worst;
}

double max_abs(const TensorView& a) {
  double m = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(element(a, i)));
  return m;
}

ScratchDir::ScratchDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "qkv_test_XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

ScratchDir::~ScratchDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace qkv::testing
