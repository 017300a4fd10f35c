// Attention dropout (core/dropout.h): the generator against Philox4x32-10's published answers,
// the row-at-a-time and SIMD draws against the one-weight definition, every kernel that draws
// it (each SIMD target) against the reference forward with the same mask, the keep rate and
// unbiasedness, the forward's bitwise determinism for threads 1, 2, 3 and 8 (kernel_cases.h's
// sweep), p = 0 bit for bit the call without dropout, packed batches, and the refusals. The
// backward with dropout is held where every backward option is (backward_cases.h's dropout
// cases: the reference against finite differences, every kernel against it, the bits for any
// thread count).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "core/dropout.h"
#include "kernel_cases.h"
#include "kernels/backward_kernel.h"
#include "kernels/kernel.h"
#include "qkv/attention_backward.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"

namespace qkv::testing {
namespace {

// Random123's known-answer vectors for philox4x32_10 (kat_vectors): counter, key, answer.
TEST(Philox, KnownAnswers) {
  struct Kat {
    std::array<std::uint32_t, 4> counter;
    std::uint32_t k0, k1;
    std::array<std::uint32_t, 4> answer;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, 0, 0, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       0xffffffffu,
       0xffffffffu,
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       0xa4093822u,
       0x299f31d0u,
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& kat : kats) {
    EXPECT_EQ(core::philox4x32_10(kat.counter, kat.k0, kat.k1), kat.answer);
  }
}

core::Dropout dropout_of(double p, std::uint64_t seed, std::uint32_t offset, std::int64_t heads) {
  core::Dropout d;
  d.threshold = static_cast<std::uint32_t>(std::nearbyint(p * 65536.0));
  d.keep_scale = 65536.0 / (65536.0 - d.threshold);
  d.seed = seed;
  d.offset = offset;
  d.heads = heads;
  return d;
}

// The eight calls of a row's 64 keys give each key the draw the definition gives it.
TEST(DropoutDraws, RowOfEightCallsMatchesTheDefinition) {
  const core::Dropout d = dropout_of(0.25, 0x123456789abcdefull, 7, 3);
  for (std::int64_t b : {0, 2}) {
    for (std::int64_t h : {0, 2}) {
      for (std::int64_t i : {0, 5, 1000}) {
        for (std::int64_t j0 : {0, 64, 64 * 77}) {
          std::uint32_t draws[core::kDropoutKeys];
          core::dropout_draws_row(d, core::dropout_head_word(d, b, h), i, j0, draws);
          for (std::int64_t x = 0; x < core::kDropoutKeys; ++x) {
            ASSERT_EQ(draws[x], core::dropout_draw(d, b, h, i, j0 + x)) << j0 + x;
          }
        }
      }
    }
  }
  // A span that starts and ends inside blocks.
  std::vector<double> s(150, 1.0);
  core::dropout_span_scalar(d, core::dropout_head_word(d, 1, 1), 3, 30, 150, s.data());
  for (std::int64_t x = 0; x < 150; ++x) {
    const bool keep = core::dropout_keeps(d, 1, 1, 3, 30 + x);
    EXPECT_EQ(s[static_cast<std::size_t>(x)], keep ? d.keep_scale : 0.0) << x;
  }
}

struct DropoutCase {
  std::string name;
  KernelCase c;
  double p = 0.3;
};

std::vector<DropoutCase> dropout_cases() {
  std::vector<DropoutCase> cases;
  const KernelCase c = case_of_shape(2, 4, 2, 70, 150, 24, 20);
  cases.push_back({"gqa_ragged", c, 0.3});
  KernelCase causal = c;
  causal.causal = true;
  causal.nq = causal.nk = 130;
  cases.push_back({"causal", causal, 0.5});
  KernelCase masked = c;
  masked.mask = MaskKind::kDeadRows;
  masked.strided = true;
  cases.push_back({"mask_dead_rows_strided", masked, 0.1});
  KernelCase f64 = c;
  f64.in_dtype = DType::kF64;
  cases.push_back({"float64", f64, 0.3});
  KernelCase high = c;
  high.nk = 64;
  cases.push_back({"p_0_9", high, 0.9});
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<DropoutCase>& info) {
  return info.param.name;
}

// How many weights one result drops (0) where the other keeps them, or the reverse.
std::int64_t mask_mismatches(const Tensor& a, const Tensor& b) {
  const Tensor x = contiguous_copy(a.view(), DType::kF64);
  const Tensor y = contiguous_copy(b.view(), DType::kF64);
  std::int64_t mismatched = 0;
  for (std::int64_t e = 0; e < x.numel(); ++e) {
    mismatched += (x.data_as<double>()[e] == 0.0) != (y.data_as<double>()[e] == 0.0);
  }
  return mismatched;
}

class DropoutForward : public ::testing::TestWithParam<DropoutCase> {};

// Every kernel that draws dropout keeps and drops exactly the reference's weights, and its
// output, weights and lse agree with the reference's to float32 rounding.
TEST_P(DropoutForward, EveryKernelDrawsTheReferenceMask) {
  const DropoutCase& dc = GetParam();
  const CaseInputs in = make_inputs(dc.c, 11);
  AttentionOptions options = in.options(dc.c);
  options.dropout_p = dc.p;
  options.seed = 0xdeadbeef12345ull;
  options.dropout_offset = 3;
  options.return_weights = true;
  options.return_lse = true;
  options.threads = 2;
  options.kernel = "reference";
  const AttentionResult ref = attention(in.q, in.k, in.v, options);
  int ran = 0;
  for (const KernelRun& run : kernel_runs()) {
    if (run.kernel == "reference") continue;
    options.kernel = run.kernel;
    kernels::simd_force_target(run.target);
    if (run.kernel.find("decode") != std::string::npos || run.kernel == "unfused_blas") {
      // These draw no dropout: they decline, and forcing one is an error naming the kernel.
      EXPECT_THROW(attention(in.q, in.k, in.v, options), Error) << run.label;
      kernels::simd_force_target(0);
      continue;
    }
    SCOPED_TRACE(run.label);
    const AttentionResult r = attention(in.q, in.k, in.v, options);
    kernels::simd_force_target(0);
    ++ran;
    EXPECT_EQ(mask_mismatches(r.weights, ref.weights), 0);
    // Outputs in [-1, 1] scaled by up to 1/(1 - p) = 10; float32 sums of up to 150 terms.
    const double tol = 2e-6 / (1.0 - dc.p);
    EXPECT_LE(max_error(r.out.view(), ref.out.view()), tol * 10);
    EXPECT_LE(max_error(r.weights.view(), ref.weights.view()), tol);
    EXPECT_LE(max_error(r.lse.view(), ref.lse.view()), 1e-5);
  }
  EXPECT_GE(ran, 1);
}

INSTANTIATE_TEST_SUITE_P(Cases, DropoutForward, ::testing::ValuesIn(dropout_cases()), case_name);

// The bf16 path (fused_hwy's bf16 micro-kernels where the CPU has them, and every kernel on
// bf16 storage): the same mask as the reference on the same rounded inputs; P rounded to bf16
// for P·V costs about 2^-8 relative.
TEST(DropoutForwardBf16, SameMaskAsTheReference) {
  KernelCase c = case_of_shape(1, 2, 1, 50, 200, 32, 32);
  c.causal = true;
  c.in_dtype = DType::kBF16;
  const CaseInputs in = make_inputs(c, 13);
  AttentionOptions options = in.options(c);
  options.dropout_p = 0.2;
  options.seed = 17;
  options.return_weights = true;
  options.kernel = "reference";
  const AttentionResult ref = attention(in.q, in.k, in.v, options);
  for (const KernelRun& run : kernel_runs()) {
    if (run.kernel != "fused_hwy" && run.kernel != "fused_scalar") continue;
    SCOPED_TRACE(run.label);
    options.kernel = run.kernel;
    kernels::simd_force_target(run.target);
    const AttentionResult r = attention(in.q, in.k, in.v, options);
    kernels::simd_force_target(0);
    EXPECT_EQ(mask_mismatches(r.weights, ref.weights), 0);
    EXPECT_LE(max_error(r.out.view(), ref.out.view()), 2e-2);
  }
}

// With Q = 0 every weight of a row is 1/nk: the share of weights kept is 1 - t/65536 within 5
// standard deviations, overall and at each of the 64 positions of a block of draws (a lane of
// the SIMD generator that never dropped would show there), and each row's dropped weights
// still sum to 1 on average (unbiasedness).
TEST(DropoutStatistics, KeepRateAndUnbiasedness) {
  const std::int64_t b = 2, h = 2, n = 256;
  for (const double p : {0.1, 0.5}) {
    SCOPED_TRACE("p " + std::to_string(p));
    Tensor q(DType::kF32, {b, h, n, 16}, "Q");
    std::fill_n(q.data_as<float>(), q.numel(), 0.0f);
    const Tensor k = random_tensor(DType::kF32, {b, h, n, 16}, 1);
    const Tensor v = random_tensor(DType::kF32, {b, h, n, 16}, 2);
    AttentionOptions options;
    options.dropout_p = p;
    options.seed = 777;
    options.return_weights = true;
    const AttentionResult r = attention(q.view(), k.view(), v.view(), options);
    const float* w = r.weights.data_as<float>();
    const double t = std::nearbyint(p * 65536.0);
    const double keep = 1.0 - t / 65536.0;
    std::vector<double> kept_at(64, 0.0);
    double kept = 0.0;
    double row_sums = 0.0, row_sums_sq = 0.0;
    const std::int64_t rows = b * h * n;
    for (std::int64_t row = 0; row < rows; ++row) {
      double sum = 0.0;
      for (std::int64_t j = 0; j < n; ++j) {
        const double x = w[row * n + j];
        sum += x;
        if (x != 0.0) {
          kept += 1.0;
          kept_at[static_cast<std::size_t>(j % 64)] += 1.0;
          EXPECT_FLOAT_EQ(static_cast<float>(x), static_cast<float>(65536.0 / (65536.0 - t) / n));
        }
      }
      row_sums += sum;
      row_sums_sq += sum * sum;
    }
    const double total = static_cast<double>(rows * n);
    EXPECT_NEAR(kept / total, keep, 5 * std::sqrt(keep * (1 - keep) / total));
    const double per_position = total / 64;
    for (std::size_t x = 0; x < 64; ++x) {
      EXPECT_NEAR(kept_at[x] / per_position, keep,
                  5 * std::sqrt(keep * (1 - keep) / per_position))
          << "position " << x;
    }
    const double mean = row_sums / static_cast<double>(rows);
    const double sd = std::sqrt(std::max(0.0, row_sums_sq / static_cast<double>(rows) - mean * mean));
    EXPECT_NEAR(mean, 1.0, 5 * sd / std::sqrt(static_cast<double>(rows)));
    EXPECT_GT(sd, 0.0);
  }
}

// Bitwise the same for any thread count: output, weights and lse of every kernel that draws it.
TEST(DropoutDeterminism, BitwiseIdenticalForThreads1238) {
  const KernelCase c = thread_sweep_case(/*causal=*/true);
  const CaseInputs in = make_inputs(c, 31);
  std::vector<std::string> forward = {"fused_scalar", "reference"};
  const auto names = attention_kernel_names();
  if (std::find(names.begin(), names.end(), "fused_hwy") != names.end()) {
    forward.push_back("fused_hwy");
  }
  AttentionOptions options = in.options(c);
  options.dropout_p = 0.2;
  options.seed = 5;
  options.return_weights = true;
  options.return_lse = true;
  for (const std::string& kernel : forward) {
    SCOPED_TRACE(kernel);
    options.kernel = kernel;
    expect_same_bits_for_threads(in, options, {2, 3, 8});
  }
}

// dropout_p = 0 is the call without dropout, bit for bit, whatever the seed and offset.
TEST(DropoutZero, BitIdenticalToNoDropout) {
  KernelCase c;
  c.nq = 80;
  c.nk = 100;
  c.causal = true;
  const CaseInputs in = make_inputs(c, 41);
  AttentionOptions plain = in.options(c);
  plain.return_weights = true;
  plain.return_lse = true;
  AttentionOptions zero = plain;
  zero.dropout_p = 0.0;
  zero.seed = 123456;
  zero.dropout_offset = 9;
  const AttentionResult a = attention(in.q, in.k, in.v, plain);
  const AttentionResult z = attention(in.q, in.k, in.v, zero);
  EXPECT_EQ(a.kernel, z.kernel);
  EXPECT_TRUE(bitwise_equal(a.out, z.out));
  EXPECT_TRUE(bitwise_equal(a.weights, z.weights));
  EXPECT_TRUE(bitwise_equal(a.lse, z.lse));
  const Tensor dout = random_tensor(DType::kF32, a.out.shape(), 4);
  const AttentionGradients ga =
      attention_backward(in.q, in.k, in.v, a.out.view(), a.lse.view(), dout.view(), plain);
  const AttentionGradients gz =
      attention_backward(in.q, in.k, in.v, a.out.view(), a.lse.view(), dout.view(), zero);
  EXPECT_TRUE(bitwise_equal(ga.dq, gz.dq));
  EXPECT_TRUE(bitwise_equal(ga.dk, gz.dk));
  EXPECT_TRUE(bitwise_equal(ga.dv, gz.dv));
}

// The seed and the offset each change the mask; the same pair draws the same one.
TEST(DropoutSeeds, SeedAndOffsetChooseTheMask) {
  KernelCase c;
  c.nq = c.nk = 64;
  const CaseInputs in = make_inputs(c, 51);
  AttentionOptions options = in.options(c);
  options.dropout_p = 0.5;
  options.return_weights = true;
  options.seed = 1;
  const Tensor base = attention(in.q, in.k, in.v, options).weights;
  EXPECT_TRUE(bitwise_equal(base, attention(in.q, in.k, in.v, options).weights));
  options.seed = 2;
  EXPECT_FALSE(bitwise_equal(base, attention(in.q, in.k, in.v, options).weights));
  options.seed = 1;
  options.dropout_offset = 1;
  EXPECT_FALSE(bitwise_equal(base, attention(in.q, in.k, in.v, options).weights));
}

// A packed batch draws sequence s's mask as batch s of a batched call.
TEST(DropoutPacked, SequencesDrawAsBatches) {
  const KernelCase c = case_of_shape(2, 2, 2, 70, 70, 16, 16);
  const CaseInputs in = make_inputs(c, 61);
  AttentionOptions options = in.options(c);
  options.causal = true;
  options.dropout_p = 0.3;
  options.seed = 8;
  const AttentionResult batched = attention(in.q, in.k, in.v, options);
  // [B, H, N, D] -> [H, B·N, D]
  const auto pack = [&](const TensorView& x) {
    const std::int64_t d = x.shape[3];
    Tensor t(DType::kF32, {c.h, c.b * c.nq, d}, x.name);
    const Tensor src = contiguous_copy(x, DType::kF32);
    for (std::int64_t b = 0; b < c.b; ++b)
      for (std::int64_t h = 0; h < c.h; ++h)
        for (std::int64_t i = 0; i < c.nq; ++i)
          for (std::int64_t e = 0; e < d; ++e)
            t.data_as<float>()[(h * c.b * c.nq + b * c.nq + i) * d + e] =
                src.data_as<float>()[((b * c.h + h) * c.nq + i) * d + e];
    return t;
  };
  const Tensor q = pack(in.q), k = pack(in.k), v = pack(in.v);
  Tensor cu(DType::kI64, {3}, "cu");
  cu.data_as<std::int64_t>()[0] = 0;
  cu.data_as<std::int64_t>()[1] = c.nq;
  cu.data_as<std::int64_t>()[2] = 2 * c.nq;
  options.cu_seqlens_q = cu.view();
  options.cu_seqlens_k = cu.view();
  const AttentionResult packed = attention(q.view(), k.view(), v.view(), options);
  EXPECT_LE(max_error(packed.out.view(), pack(batched.out.view()).view()), 1e-6);
}

TEST(DropoutErrors, RateOutsideZeroOneIsRefused) {
  KernelCase c;
  const CaseInputs in = make_inputs(c, 71);
  for (const double p : {1.0, -0.1, std::nan(""), 2.0}) {
    AttentionOptions options = in.options(c);
    options.dropout_p = p;
    try {
      attention(in.q, in.k, in.v, options);
      ADD_FAILURE() << "dropout_p " << p << " was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.subject(), "dropout_p");
    }
  }
}

// Decoding against a KV cache draws no dropout: refused, naming the option.
TEST(DropoutErrors, KVCacheRefusesDropout) {
  KVCacheOptions cache_options;
  cache_options.kv_heads = 1;
  cache_options.d = cache_options.dv = 4;
  KVCache cache(cache_options);
  const SequenceId seq = cache.add_sequence();
  const Tensor q = random_tensor(DType::kF32, {1, 1, 4}, 1);
  AttentionOptions options;
  options.dropout_p = 0.1;
  try {
    attention_cached(q.view(), cache, std::span<const SequenceId>(&seq, 1), options);
    ADD_FAILURE() << "dropout with a KV cache was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), "dropout_p");
  }
}

}  // namespace
}  // namespace qkv::testing
