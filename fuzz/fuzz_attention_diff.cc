// Differential fuzz target: every kernel of attention_kernel_names() against the float64
// reference, on small random shapes and options chosen by the input (ranks 2-4, grouped-query
// heads, causal, windows, bool and float masks with broadcasting and -inf, scales, dtypes,
// thread counts; then the version-2 options: softcap, ALiBi standard or given slopes, sinks,
// bf16/f16 storage and the dtype option, float16 outputs, packed offsets). A kernel may decline
// a call (qkv::Error); when it runs, its output, weights and lse must match the reference within
// float32 tolerance (plus bf16's 2^-8 on P·V when the call computes in bf16, and float16's
// rounding of a float16 output), rows with no allowed key must be exactly zero with lse = -inf
// (or the sink), and nothing may be NaN. Then the backward: every backward kernel against the
// float64 reference backward (check_backward), and without sinks dV's rows summing to dO's
// (check_dv_sums, whatever the scores). The version-2 and version-3 draws come after every
// earlier one, so an input written before them means what it meant (past its end, a draw is 0:
// no modifier).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
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
  switch (t.dtype()) {
    case qkv::DType::kF32: return static_cast<double>(t.data_as<float>()[i]);
    case qkv::DType::kF64: return t.data_as<double>()[i];
    default: return qkv::contiguous_copy(t.view(), qkv::DType::kF64).data_as<double>()[i];
  }
}

// `relative` adds that fraction of |reference| to the tolerance (a float16 output's rounding).
void compare(const qkv::Tensor& got_stored, const qkv::Tensor& want, double tolerance,
             const std::string& what, double relative = 0.0) {
  if (got_stored.shape() != want.shape()) qkv::fuzz::fail(what + ": shape differs");
  const qkv::Tensor got = qkv::contiguous_copy(got_stored.view(), qkv::DType::kF64);
  const double limit = got_stored.dtype() == qkv::DType::kF16 ? 65504.0
                                                               : std::numeric_limits<float>::max();
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double g = at(got, i), w = at(want, i);
    if (std::isnan(g)) qkv::fuzz::fail(what + ": NaN at " + std::to_string(i));
    // A float32 (float16) output holds an answer beyond its range (an lse past 3.4e38) as inf.
    const bool rounds_to_inf = got_stored.dtype() != qkv::DType::kF64 && std::fabs(w) > limit &&
                               g == std::copysign(std::numeric_limits<double>::infinity(), w);
    if (rounds_to_inf) continue;
    if (std::isinf(w) || std::isinf(g)) {
      if (g != w) qkv::fuzz::fail(what + ": infinity mismatch at " + std::to_string(i));
      continue;
    }
    if (std::fabs(g - w) > tolerance + relative * std::fabs(w)) {
      qkv::fuzz::fail(what + ": element " + std::to_string(i) + " is " + std::to_string(g) +
                      ", reference " + std::to_string(w));
    }
  }
}

}  // namespace

namespace {

// Without sinks each row with an allowed key has weights summing to 1, so dV's rows of a kv
// head sum to the dO rows of its query heads that have one (lse finite): Σ_j dV_jc = Σ_i dO_ic,
// whatever the scores. The tolerance does not grow with them: weights recomputed from the saved
// lse broke this by 2e-3 of Σ|dO| at scores of 4e4, in float32 (the red team's finding).
void check_dv_sums(const qkv::Tensor& dv, const qkv::Tensor& dout, const qkv::Tensor& lse,
                   const std::string& kernel) {
  const qkv::Shape& vs = dv.shape();
  const qkv::Shape& os = dout.shape();
  const std::size_t rank = vs.size();
  const std::int64_t nk = vs[rank - 2], width = vs[rank - 1], nq = os[rank - 2];
  const std::int64_t hkv = rank >= 3 ? vs[rank - 3] : 1, h = rank >= 3 ? os[rank - 3] : 1;
  const std::int64_t batch = rank == 4 ? vs[0] : 1;
  if (hkv == 0 || width == 0) return;
  const std::int64_t group = h / hkv;
  const double eps = dv.dtype() == qkv::DType::kF64 ? 2.3e-16 : 1.2e-7;
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t hk = 0; hk < hkv; ++hk) {
      for (std::int64_t c = 0; c < width; ++c) {
        double got = 0.0, want = 0.0, size = 0.0;
        for (std::int64_t j = 0; j < nk; ++j) got += at(dv, ((b * hkv + hk) * nk + j) * width + c);
        for (std::int64_t hq = hk * group; hq < (hk + 1) * group; ++hq) {
          for (std::int64_t i = 0; i < nq; ++i) {
            if (std::isinf(at(lse, (b * h + hq) * nq + i))) continue;
            const double x = at(dout, ((b * h + hq) * nq + i) * width + c);
            want += x;
            size += std::fabs(x);
          }
        }
        const double tolerance = 64 * eps * static_cast<double>(nk + nq + 16) * (size + 1e-30);
        if (!(std::fabs(got - want) <= tolerance)) {
          qkv::fuzz::fail((kernel + ": the rows of dV do not sum to those of dO: " +
                           std::to_string(got) + " against " + std::to_string(want))
                              .c_str());
        }
      }
    }
  }
}

// The backward: every backward kernel against the float64 reference backward on the same
// inputs, options and a random dO, from the reference forward's out and lse. float16 storage
// must be refused in one line. Tolerance: the float32 forward's relative error carried through
// the five products (each summing at most nq + nk terms), against the gradient's own scale.
// A bf16 call (products of bf16-rounded operands) is held here to finite gradients wherever the
// reference's are finite; its accuracy against the plain bf16 composition is
// tests/kernels/backward_bf16_test.cc's.
void check_backward(const qkv::Tensor& q, const qkv::Tensor& k, const qkv::Tensor& v,
                    const qkv::AttentionResult& want, qkv::AttentionOptions options,
                    qkv::DType stored, Rng& rng, double range, double score_bound) {
  qkv::Tensor dout = random_tensor(qkv::DType::kF32, want.out.shape(), rng, 1.0, "dO");
  options.return_weights = false;
  options.kernel = "reference";
  const qkv::DType computed = options.dtype ? *options.dtype : stored;
  const bool half = computed == qkv::DType::kF16;
  const bool bf16 = computed == qkv::DType::kBF16;
  qkv::AttentionGradients ref;
  try {
    ref = qkv::attention_backward(q.view(), k.view(), v.view(), want.out.view(), want.lse.view(),
                                  dout.view(), options);
  } catch (const qkv::Error& e) {
    qkv::fuzz::check_one_line(e.what());
    // float16 storage, or gradients beyond float64's range: refusals, not findings.
    return;
  }
  if (half) qkv::fuzz::fail("the backward accepted float16 storage");
  const auto scale_of = [](const qkv::Tensor& t) {
    double m = 0.0;
    for (std::int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(at(t, i)));
    return m;
  };
  const double terms = static_cast<double>(q.numel() + k.numel() + 1);
  const double relative = 64 * 1.2e-7 * (score_bound + std::sqrt(terms) + 16);
  for (const std::string& kernel : qkv::attention_backward_kernel_names()) {
    if (kernel == "reference") continue;
    options.kernel = kernel;
    qkv::AttentionGradients got;
    try {
      got = qkv::attention_backward(q.view(), k.view(), v.view(), want.out.view(),
                                    want.lse.view(), dout.view(), options);
    } catch (const qkv::Error& e) {
      qkv::fuzz::check_one_line(e.what());
      continue;
    }
    if (bf16) {
      // (Past bf16's largest finite value a gradient rounds to an infinity, as it may.)
      for (const auto& [g, r, name] : {std::tuple{&got.dq, &ref.dq, " dQ"},
                                       std::tuple{&got.dk, &ref.dk, " dK"},
                                       std::tuple{&got.dv, &ref.dv, " dV"}}) {
        const qkv::Tensor got64 = qkv::contiguous_copy(g->view(), qkv::DType::kF64);
        const qkv::Tensor ref64 = qkv::contiguous_copy(r->view(), qkv::DType::kF64);
        for (std::int64_t i = 0; i < ref64.numel(); ++i) {
          const double want_i = ref64.data_as<double>()[i];
          if (std::fabs(want_i) < 3.3e38 && !std::isfinite(got64.data_as<double>()[i])) {
            qkv::fuzz::fail((kernel + name + ": not finite where the reference is").c_str());
          }
        }
      }
      continue;
    }
    compare(got.dq, ref.dq, relative * (scale_of(ref.dq) + range) + 1e-6, kernel + " dQ");
    compare(got.dk, ref.dk, relative * (scale_of(ref.dk) + range) + 1e-6, kernel + " dK");
    compare(got.dv, ref.dv, relative * (scale_of(ref.dv) + 1.0) + 1e-6, kernel + " dV");
    if (!ref.dsinks.empty()) {
      compare(got.dsinks, ref.dsinks, relative * (scale_of(ref.dsinks) + 1.0) + 1e-6,
              kernel + " dsinks");
    } else {
      check_dv_sums(got.dv, dout, want.lse, kernel);
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
  // Version 2, drawn last (0 past the input's end: none of them).
  const double caps[] = {0.0, 0.5, 5.0, 50.0};
  const double softcap = caps[in.in(0, 3)];
  const unsigned alibi_kind = static_cast<unsigned>(in.in(0, 2));  // none, standard, given
  const bool with_sinks = in.flag();
  const qkv::DType dtypes[] = {qkv::DType::kF32, qkv::DType::kBF16, qkv::DType::kF16,
                               qkv::DType::kF32, qkv::DType::kF64};
  const std::int64_t dtype_choice = in.in(0, 4);  // 0: no dtype option
  const std::int64_t stored_choice = in.in(0, 2);  // Q, K, V stored as drawn, bf16 or f16
  const bool f16_out = in.flag();
  const bool packed = in.flag() && rank <= 3;
  const std::int64_t sequences = in.in(0, 3);
  std::vector<std::int64_t> cut_q, cut_k;
  for (std::int64_t s = 1; s < sequences; ++s) {
    cut_q.push_back(in.in(0, nq));
    cut_k.push_back(in.in(0, nk));
  }
  // Version 3, after every earlier draw: Q and K of magnitude 100 instead of 8 (scores of 1e4
  // to 1e6, where weights recomputed from the saved lse lost the gradients' precision).
  const bool large_qk = in.flag() && range == 8.0;
  if (softcap > 0) options.softcap = softcap;
  options.alibi = alibi_kind == 1;
  // Rounding values beyond 65504 to float16 makes them infinite, which validation does not
  // refuse today (a known library issue, tests/core/validate_options_test.cc): f16 only for
  // magnitudes float16 holds, so that the fuzzer looks for other findings.
  if (dtype_choice != 0 && !(dtypes[dtype_choice] == qkv::DType::kF16 && range > 8.0)) {
    options.dtype = dtypes[dtype_choice];
  }
  // float16 cannot hold the large magnitudes; float16 outputs only where the answers fit.
  const qkv::DType stored = stored_choice == 1 ? qkv::DType::kBF16
                            : stored_choice == 2 && range <= 8.0 ? qkv::DType::kF16
                                                                : dtype;
  if (f16_out && range <= 8.0 && options.scale.value_or(1.0) < 10) {
    options.out_dtype = qkv::DType::kF16;
  }

  auto shaped = [&](std::int64_t heads, std::int64_t rows, std::int64_t cols) {
    qkv::Shape s;
    if (rank == 4) s.push_back(b);
    if (rank >= 3) s.push_back(heads);
    s.push_back(rows);
    s.push_back(cols);
    return s;
  };
  const double qk_range = range > 1e20 ? 1.0 : large_qk ? 100.0 : range;
  const qkv::Tensor q = random_tensor(dtype, shaped(h, nq, d), rng, qk_range, "Q").to(stored);
  const qkv::Tensor k = random_tensor(dtype, shaped(hkv, nk, d), rng, qk_range, "K").to(stored);
  const qkv::Tensor v = random_tensor(dtype, shaped(hkv, nk, dv), rng, range, "V").to(stored);
  qkv::Tensor slopes, sinks, cu_q, cu_k;
  if (alibi_kind == 2) {
    slopes = random_tensor(qkv::DType::kF32, {h}, rng, 1.0, "slopes");
    for (std::int64_t x = 0; x < h; ++x) slopes.data_as<float>()[x] += 1.0f;  // in [0, 2]
    options.alibi_slopes = slopes.view();
  }
  if (with_sinks) {
    sinks = random_tensor(qkv::DType::kF32, {h}, rng, 3.0, "sinks");
    options.sinks = sinks.view();
  }
  if (packed) {
    const auto offsets = [&](std::vector<std::int64_t> cuts, std::int64_t total, const char* name) {
      std::sort(cuts.begin(), cuts.end());
      qkv::Tensor t(qkv::DType::kI64, {static_cast<std::int64_t>(cuts.size()) + 2}, name);
      t.data_as<std::int64_t>()[0] = 0;
      for (std::size_t x = 0; x < cuts.size(); ++x) t.data_as<std::int64_t>()[x + 1] = cuts[x];
      t.data_as<std::int64_t>()[cuts.size() + 1] = total;
      return t;
    };
    cu_q = offsets(cut_q, nq, "cu_seqlens_q");
    cu_k = offsets(cut_k, nk, "cu_seqlens_k");
    options.cu_seqlens_q = cu_q.view();
    options.cu_seqlens_k = cu_k.view();
    options.return_weights = false;  // neither weights nor a mask with a packed batch
  }
  qkv::Tensor mask;
  if (mask_kind != 0 && !packed) {
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
  reference_options.return_weights = !packed;
  reference_options.return_lse = true;
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
  // ALiBi adds at most max|slope|·max(nq, nk) (slopes <= 2), a sink one more score of up to 3.
  const double scale =
      options.scale.value_or(d > 0 ? 1.0 / std::sqrt(static_cast<double>(d)) : 1.0);
  const double alibi_bound = alibi_kind == 0 ? 0.0 : 2.0 * static_cast<double>(std::max(nq, nk));
  const double score_bound =
      qk_range * qk_range * static_cast<double>(d) * scale + 2.0 + alibi_bound + 3.0;
  const double relative = 16 * 1.2e-7 * (score_bound + static_cast<double>(nk));
  // bf16 computation rounds P to bf16 (2^-9 relative) before P·V: the weights and the output
  // may be off by a few of those; float16 outputs add their own rounding (2^-11 relative).
  const bool bf16 = options.dtype ? *options.dtype == qkv::DType::kBF16 : stored == qkv::DType::kBF16;
  const double p_rounding = bf16 ? std::ldexp(1.0, -7) : 0.0;
  const double out_rounding = options.out_dtype == qkv::DType::kF16 ? std::ldexp(1.0, -11) : 0.0;
  const double out_tolerance = range * (relative + p_rounding) + 1e-6;
  for (const std::string& kernel : qkv::attention_kernel_names()) {
    options.kernel = kernel;
    qkv::AttentionResult got;
    try {
      got = qkv::attention(q.view(), k.view(), v.view(), options);
    } catch (const qkv::Error& e) {
      qkv::fuzz::check_one_line(e.what());
      if (kernel == "reference") {
        // A float16 output refuses a value past its range (the lse of scores above 65504, say)
        // rather than write inf: the reference's refusal is then the contract, not a finding
        // (its float64 run above had no such limit). Kernels that ran before it were compared.
        const std::string message = e.what();
        if (options.out_dtype == qkv::DType::kF16 &&
            message.starts_with("out_dtype: float16 cannot hold")) {
          return 0;
        }
        qkv::fuzz::fail("the reference declined: " + message);
      }
      continue;
    }
    compare(got.out, want.out, out_tolerance, kernel + " out", out_rounding);
    if (options.return_weights) {
      compare(got.weights, want.weights, relative + p_rounding, kernel + " weights", out_rounding);
    }
    if (options.return_lse) {
      compare(got.lse, want.lse, relative * score_bound, kernel + " lse", out_rounding);
    }
    // Rows with no allowed key (lse -inf; with sinks, lse exactly the sink and a reference row
    // of exact zeros, since a sink far above the row's scores also gives lse == sink in double
    // while its keys still carry weights near 1e-20): exactly zero.
    const std::int64_t rows = want.lse.numel();
    for (std::int64_t r = 0; r < rows; ++r) {
      const double lse = want.lse.data_as<double>()[r];
      // lse is [.., h, nq]: row r belongs to query head (r / nq) % h.
      bool empty = with_sinks ? lse == static_cast<double>(sinks.data_as<float>()[(r / nq) % h])
                              : std::isinf(lse) && lse < 0;
      for (std::int64_t c = 0; c < dv && empty && with_sinks; ++c) {
        empty = at(want.out, r * dv + c) == 0.0;
      }
      if (!empty) continue;
      for (std::int64_t c = 0; c < dv; ++c) {
        if (at(got.out, r * dv + c) != 0.0) qkv::fuzz::fail(kernel + ": masked row not zero");
      }
    }
  }
  check_backward(q, k, v, want, options, stored, rng, range, score_bound);
  return 0;
}
