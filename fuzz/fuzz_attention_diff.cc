// Differential fuzz target: every kernel of attention_kernel_names() against the float64
// reference, on small random shapes and options chosen by the input (ranks 2-4, grouped-query
// heads, causal, windows, bool and float masks with broadcasting and -inf, scales, dtypes,
// thread counts). A kernel may decline a call (qkv::Error); when it runs, its output, weights
// and lse must match the reference within float32 tolerance, rows with no allowed key must be
// exactly zero with lse = -inf, and nothing may be NaN.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "qkv/attention.h"
#include "qkv/error.h"

namespace {

// Reads the input front to back; past its end, zeros.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  unsigned next() { return pos_ < size_ ? data_[pos_++] : 0u; }
  std::int64_t in(std::int64_t lo, std::int64_t hi) {  // [lo, hi]
    return lo + static_cast<std::int64_t>(next() % static_cast<unsigned>(hi - lo + 1));
  }
  bool flag() { return (next() & 1u) != 0; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

struct Rng {  // values, reproducible from a seed taken from the input
  std::uint64_t state;
  double uniform() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) / 9007199254740992.0;
  }
};

qkv::Tensor random_tensor(qkv::DType dtype, const qkv::Shape& shape, Rng& rng, double range,
                          const char* name) {
  qkv::Tensor t(dtype, shape, name);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double x = (2 * rng.uniform() - 1) * range;
    if (dtype == qkv::DType::kF32) {
      t.data_as<float>()[i] = static_cast<float>(x);
    } else {
      t.data_as<double>()[i] = x;
    }
  }
  return t;
}

double at(const qkv::Tensor& t, std::int64_t i) {
  return t.dtype() == qkv::DType::kF32 ? static_cast<double>(t.data_as<float>()[i])
                                       : t.data_as<double>()[i];
}

void compare(const qkv::Tensor& got, const qkv::Tensor& want, double tolerance,
             const std::string& what) {
  if (got.shape() != want.shape()) qkv::fuzz::fail(what + ": shape differs");
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double g = at(got, i), w = at(want, i);
    if (std::isnan(g)) qkv::fuzz::fail(what + ": NaN at " + std::to_string(i));
    // A float32 output holds an answer beyond float32's range (an lse past 3.4e38) as inf.
    const bool rounds_to_inf = got.dtype() == qkv::DType::kF32 &&
                               std::fabs(w) > std::numeric_limits<float>::max() &&
                               g == std::copysign(std::numeric_limits<double>::infinity(), w);
    if (rounds_to_inf) continue;
    if (std::isinf(w) || std::isinf(g)) {
      if (g != w) qkv::fuzz::fail(what + ": infinity mismatch at " + std::to_string(i));
      continue;
    }
    if (std::fabs(g - w) > tolerance) {
      qkv::fuzz::fail(what + ": element " + std::to_string(i) + " is " + std::to_string(g) +
                      ", reference " + std::to_string(w));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  const int rank = static_cast<int>(in.in(2, 4));
  // Every dimension may be 0 (B, H with Hkv, Nq, Nk, D, Dv): the defined empty result.
  const std::int64_t b = rank == 4 ? in.in(0, 2) : 1;
  const std::int64_t hkv = rank >= 3 ? in.in(0, 3) : 1;
  const std::int64_t h = rank >= 3 ? hkv * in.in(0, 3) : 1;
  const std::int64_t nq = in.in(0, 24);
  const std::int64_t nk = in.in(0, 40);
  const std::int64_t d = in.in(0, 20);
  const std::int64_t dv = in.in(0, 20);
  const qkv::DType dtype = in.flag() ? qkv::DType::kF64 : qkv::DType::kF32;

  qkv::AttentionOptions options;
  options.causal = in.flag();
  if (in.flag()) options.window = qkv::Window{in.in(-1, 6), in.in(-1, 6)};
  switch (in.in(0, 4)) {
    case 1:
      options.scale = 1.0;
      break;
    case 2:
      options.scale = 0.05;
      break;
    case 3:
      options.scale = 2.5;
      break;
    case 4:
      options.scale = 1e39;  // beyond float32: the float32 kernels must decline or stay exact
      break;
    default:
      break;
  }
  const unsigned mask_kind = static_cast<unsigned>(in.in(0, 2));  // none, bool, float
  const unsigned broadcast = in.next();
  options.return_weights = in.flag();
  options.return_lse = in.flag();
  options.out_dtype = in.flag() ? qkv::DType::kF64 : qkv::DType::kF32;
  options.threads = static_cast<int>(in.in(1, 4));
  // Magnitudes up to 1e19 make q·k reach 1e38, past float32; V up to 3e38 makes o overflow.
  const double ranges[] = {1.0, 8.0, 1e19, 3e38};
  const double range = ranges[in.in(0, 3)];
  Rng rng{0x9E3779B97F4A7C15ULL ^ (in.next() | in.next() << 8 | in.next() << 16)};

  auto shaped = [&](std::int64_t heads, std::int64_t rows, std::int64_t cols) {
    qkv::Shape s;
    if (rank == 4) s.push_back(b);
    if (rank >= 3) s.push_back(heads);
    s.push_back(rows);
    s.push_back(cols);
    return s;
  };
  const double qk_range = range > 1e20 ? 1.0 : range;
  const qkv::Tensor q = random_tensor(dtype, shaped(h, nq, d), rng, qk_range, "Q");
  const qkv::Tensor k = random_tensor(dtype, shaped(hkv, nk, d), rng, qk_range, "K");
  const qkv::Tensor v = random_tensor(dtype, shaped(hkv, nk, dv), rng, range, "V");
  qkv::Tensor mask;
  if (mask_kind != 0) {
    qkv::Shape s = shaped(h, nq, nk);
    for (std::size_t axis = 0; axis < s.size(); ++axis) {
      if ((broadcast >> axis) & 1u) s[axis] = 1;  // broadcast along this axis
    }
    if (mask_kind == 1) {
      mask = qkv::Tensor(qkv::DType::kBool, s, "mask");
      for (std::int64_t i = 0; i < mask.numel(); ++i) mask.data_as<bool>()[i] = rng.uniform() < 0.7;
    } else {
      mask = random_tensor(qkv::DType::kF32, s, rng, 2.0, "mask");
      for (std::int64_t i = 0; i < mask.numel(); ++i) {
        if (rng.uniform() < 0.3) mask.data_as<float>()[i] = -std::numeric_limits<float>::infinity();
      }
    }
    options.mask = mask.view();
  }

  qkv::AttentionOptions reference_options = options;
  reference_options.kernel = "reference";
  reference_options.out_dtype = qkv::DType::kF64;
  reference_options.return_weights = reference_options.return_lse = true;
  qkv::AttentionResult want;
  try {
    want = qkv::attention(q.view(), k.view(), v.view(), reference_options);
  } catch (const qkv::Error& e) {
    // Only query heads with no kv head to read are refused; anything else is a finding.
    qkv::fuzz::check_one_line(e.what());
    if (!(hkv == 0 && h > 0)) qkv::fuzz::fail("the reference refused: " + std::string(e.what()));
    return 0;
  }

  // Tolerances earned by float32 arithmetic: a score is at most S = range^2·d·scale + 2 (the
  // float mask) in magnitude, so exp(s - max) carries a relative error of a few eps·S, and a
  // sum over nk terms a few eps·nk more. Indexing or masking bugs give errors of order 1.
  const double scale =
      options.scale.value_or(d > 0 ? 1.0 / std::sqrt(static_cast<double>(d)) : 1.0);
  const double score_bound = qk_range * qk_range * static_cast<double>(d) * scale + 2.0;
  const double relative = 16 * 1.2e-7 * (score_bound + static_cast<double>(nk));
  const double out_tolerance = range * relative + 1e-6;
  for (const std::string& kernel : qkv::attention_kernel_names()) {
    options.kernel = kernel;
    qkv::AttentionResult got;
    try {
      got = qkv::attention(q.view(), k.view(), v.view(), options);
    } catch (const qkv::Error& e) {
      qkv::fuzz::check_one_line(e.what());
      if (kernel == "reference")
        qkv::fuzz::fail("the reference declined: " + std::string(e.what()));
      continue;
    }
    compare(got.out, want.out, out_tolerance, kernel + " out");
    if (options.return_weights) compare(got.weights, want.weights, relative, kernel + " weights");
    if (options.return_lse) compare(got.lse, want.lse, relative * score_bound, kernel + " lse");
    // Rows with no allowed key: exactly zero.
    const std::int64_t rows = want.lse.numel();
    for (std::int64_t r = 0; r < rows; ++r) {
      if (!std::isinf(want.lse.data_as<double>()[r])) continue;
      for (std::int64_t c = 0; c < dv; ++c) {
        if (at(got.out, r * dv + c) != 0.0) qkv::fuzz::fail(kernel + ": masked row not zero");
      }
    }
  }
  return 0;
}
