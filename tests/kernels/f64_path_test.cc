// The fused kernel's float64 path (compute = kF64, the default when Q, K and V are all float64):
// fused_hwy on every compiled SIMD target and fused_scalar against the float64 reference, the
// default rule, and bitwise determinism across thread counts.
//
// Tolerance: 1e-13 relative (of max|V| for the output, absolute for the weights, of
// max(1, |lse|) for the lse). Both sides compute in float64 and differ only in the order of
// their sums (tiles of 64 keys, lane-wise partial sums, the online rescaling) and in their exp
// (ExpNonPositive64 within about 1 ulp against std::exp): each of the nk + d terms of a sum adds
// at most an ulp (1.1e-16) of the running magnitude, so nk + d <= ~600 here bounds the error near
// 7e-14 in the worst case, and measured errors are 1e-16 .. 1e-15. The float32 path errs by
// ~1e-7 on the same inputs (checked below), so the bound tells the paths apart.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/validate.h"
#include "kernel_cases.h"
#include "kernels/kernel.h"
#include "qkv/error.h"

namespace qkv::testing {
namespace {

constexpr double kRelTolerance = 1e-13;

struct F64Case {
  KernelCase shape;
  std::function<void(AttentionOptions&, const KernelCase&)> edit;  // modifiers; may be empty
};

// Per-head float64 values for sinks and ALiBi slopes.
Tensor per_head(std::int64_t h, double first, double step, const char* name) {
  Tensor t(DType::kF64, {h}, name);
  for (std::int64_t i = 0; i < h; ++i)
    t.data_as<double>()[i] = first + step * static_cast<double>(i);
  return t;
}

std::vector<F64Case> f64_cases() {
  std::vector<F64Case> cases;
  auto add = [&](const std::string& name, auto edit_shape,
                 std::function<void(AttentionOptions&, const KernelCase&)> edit = {}) {
    KernelCase c;
    c.name = name;
    c.in_dtype = DType::kF64;
    c.nq = 70;
    c.nk = 150;
    c.d = 32;
    c.dv = 48;
    edit_shape(c);
    cases.push_back({c, std::move(edit)});
  };
  for (std::int64_t d : {1, 7, 8, 64, 72, 129}) {
    add("d" + std::to_string(d), [d](KernelCase& c) { c.d = c.dv = d; });
  }
  for (auto [nq, nk] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {63, 64}, {65, 63}, {129, 128}, {1, 200}, {300, 257}}) {
    add("n" + std::to_string(nq) + "x" + std::to_string(nk), [nq, nk](KernelCase& c) {
      c.nq = nq;
      c.nk = nk;
      c.causal = nq % 2 == 1;
    });
  }
  add("nq0", [](KernelCase& c) { c.nq = 0; });
  add("nk0", [](KernelCase& c) { c.nk = 0; });
  add("d0", [](KernelCase& c) { c.d = 0; });
  add("dv0", [](KernelCase& c) { c.dv = 0; });
  add("h0", [](KernelCase& c) { c.h = c.hkv = 0; });
  add("b0", [](KernelCase& c) { c.b = 0; });
  add("window", [](KernelCase& c) { c.window = Window{20, 5}; });
  add("causal_window", [](KernelCase& c) {
    c.causal = true;
    c.window = Window{33, 0};
  });
  add("bool_mask", [](KernelCase& c) { c.mask = MaskKind::kBoolFull; });
  add("float_mask", [](KernelCase& c) { c.mask = MaskKind::kFloatFull; });
  add("dead_rows", [](KernelCase& c) { c.mask = MaskKind::kDeadRows; });
  add("gqa_batch", [](KernelCase& c) {
    c.b = 2;
    c.h = 6;
    c.hkv = 2;
    c.causal = true;
  });
  add("mqa", [](KernelCase& c) {
    c.h = 5;
    c.hkv = 1;
  });
  add("huge_logits", [](KernelCase& c) {
    c.magnitude = 30.0;
    c.scale = 1.0;
  });
  add("strided", [](KernelCase& c) { c.strided = true; });
  // Mixed and 16-bit inputs with dtype = f64 asked for: widened exactly into the float64 tiles.
  add("mixed_asked_f64", [](KernelCase& c) {
    c.in_dtype = DType::kF32;
    c.k_dtype = DType::kF16;
    c.v_dtype = DType::kBF16;
    c.dtype = DType::kF64;
    c.causal = true;
  });
  add(
      "softcap", [](KernelCase& c) { c.magnitude = 4.0; },
      [](AttentionOptions& o, const KernelCase&) { o.softcap = 5.0; });
  add(
      "alibi_causal", [](KernelCase& c) { c.causal = true; },
      [](AttentionOptions& o, const KernelCase&) { o.alibi = true; });
  return cases;
}

class F64Path : public ::testing::TestWithParam<F64Case> {};

double relative_to(double scale) { return kRelTolerance * std::max(1.0, scale); }

TEST_P(F64Path, FusedKernelsMatchTheReferenceTo1e13) {
  const KernelCase& c = GetParam().shape;
  const CaseInputs in = make_inputs(c, 4321);
  AttentionOptions options = in.options(c);
  if (GetParam().edit) GetParam().edit(options, c);
  options.threads = 2;
  options.return_weights = true;
  options.return_lse = true;
  options.out_dtype = DType::kF64;

  AttentionOptions ref_options = options;
  ref_options.kernel = "reference";
  const AttentionResult ref = attention(in.q, in.k, in.v, ref_options);
  const double max_v = max_abs(in.v);
  double max_lse = 1.0;
  for (std::int64_t e = 0; e < ref.lse.numel(); ++e) {
    const double x = ref.lse.data_as<double>()[e];
    if (std::isfinite(x)) max_lse = std::max(max_lse, std::abs(x));
  }

  int runs = 0;
  for (const KernelRun& run : kernel_runs()) {
    if (run.kernel != "fused_hwy" && run.kernel != "fused_scalar") continue;
    SCOPED_TRACE(run.label);
    ++runs;
    kernels::simd_force_target(run.target);
    options.kernel = run.kernel;
    const AttentionResult got = attention(in.q, in.k, in.v, options);
    kernels::simd_force_target(0);
    EXPECT_EQ(got.kernel, run.kernel);
    EXPECT_LE(max_error(got.out.view(), ref.out.view()), relative_to(max_v));
    EXPECT_LE(max_error(got.weights.view(), ref.weights.view()), kRelTolerance);
    EXPECT_LE(max_error(got.lse.view(), ref.lse.view()), relative_to(max_lse));
  }
  EXPECT_GE(runs, 1);
}

INSTANTIATE_TEST_SUITE_P(Shapes, F64Path, ::testing::ValuesIn(f64_cases()),
                         [](const ::testing::TestParamInfo<F64Case>& param) {
                           return param.param.shape.name;
                         });

// Sinks and a packed batch (one call per sequence at the entry point) on the float64 path.
TEST(F64PathModifiers, SinksAndPackedBatchMatchTheReference) {
  KernelCase c;
  c.in_dtype = DType::kF64;
  c.b = 1;
  c.h = 4;
  c.hkv = 2;
  c.nq = c.nk = 180;
  c.d = c.dv = 24;
  const CaseInputs in = make_inputs(c, 77);
  const auto drop_batch = [](TensorView v) {
    v.shape.erase(v.shape.begin());
    v.strides.erase(v.strides.begin());
    return v;
  };
  const TensorView q = drop_batch(in.q), k = drop_batch(in.k), v = drop_batch(in.v);
  const Tensor sinks = per_head(c.h, -0.5, 0.75, "sinks");
  Tensor cu(DType::kI32, {4}, "cu_seqlens");
  const std::int32_t offsets[] = {0, 50, 50, 180};
  for (int x = 0; x < 4; ++x) cu.data_as<std::int32_t>()[x] = offsets[x];
  AttentionOptions options;
  options.causal = true;
  options.sinks = sinks.view();
  options.cu_seqlens_q = options.cu_seqlens_k = cu.view();
  options.return_lse = true;
  options.out_dtype = DType::kF64;
  options.threads = 2;
  AttentionOptions ref_options = options;
  ref_options.kernel = "reference";
  const AttentionResult ref = attention(q, k, v, ref_options);
  for (const KernelRun& run : kernel_runs()) {
    if (run.kernel != "fused_hwy" && run.kernel != "fused_scalar") continue;
    SCOPED_TRACE(run.label);
    kernels::simd_force_target(run.target);
    options.kernel = run.kernel;
    const AttentionResult got = attention(q, k, v, options);
    kernels::simd_force_target(0);
    EXPECT_LE(max_error(got.out.view(), ref.out.view()), kRelTolerance);
    EXPECT_LE(max_error(got.lse.view(), ref.lse.view()), relative_to(4.0));
  }
}

// All-float64 inputs compute in float64 by default; dtype = kF32 opts into float32; mixed
// inputs keep float32.
TEST(F64DefaultRule, AllFloat64ComputesInFloat64UnlessAskedForFloat32) {
  KernelCase c;
  c.in_dtype = DType::kF64;
  c.nq = 90;
  c.nk = 140;
  c.d = c.dv = 64;
  const CaseInputs in = make_inputs(c, 11);
  AttentionOptions options = in.options(c);
  EXPECT_EQ(core::validate_attention(in.q, in.k, in.v, options).params.compute, DType::kF64);
  options.out_dtype = DType::kF64;
  AttentionOptions ref_options = options;
  ref_options.kernel = "reference";
  const AttentionResult ref = attention(in.q, in.k, in.v, ref_options);

  const AttentionResult f64 = attention(in.q, in.k, in.v, options);
  EXPECT_NE(f64.kernel, "reference");
  EXPECT_LE(max_error(f64.out.view(), ref.out.view()), 1e-14);

  options.dtype = DType::kF32;
  EXPECT_EQ(core::validate_attention(in.q, in.k, in.v, options).params.compute, DType::kF32);
  const AttentionResult f32 = attention(in.q, in.k, in.v, options);
  const double e32 = max_error(f32.out.view(), ref.out.view());
  EXPECT_GT(e32, 1e-10);  // float32 arithmetic, not float64
  EXPECT_LT(e32, 1e-6);

  KernelCase mixed = c;
  mixed.k_dtype = DType::kF32;
  const CaseInputs in_mixed = make_inputs(mixed, 11);
  EXPECT_EQ(core::validate_attention(in_mixed.q, in_mixed.k, in_mixed.v, in_mixed.options(mixed))
                .params.compute,
            DType::kF32);
}

// The float64 path declines scores that could pass float64's range; the reference runs them.
TEST(F64DefaultRule, ScoresBeyondFloat64GoToTheReference) {
  KernelCase c;
  c.in_dtype = DType::kF64;
  CaseInputs in = make_inputs(c, 5);
  in.q_store.data_as<double>()[0] = 1e200;
  in.k_store.data_as<double>()[3] = 1e200;
  const AttentionOptions options = in.options(c);
  EXPECT_EQ(attention(in.q, in.k, in.v, options).kernel, "reference");
}

TEST(F64Determinism, BitwiseIdenticalForThreads123) {
  for (const char* kernel : {"fused_hwy", "fused_scalar"}) {
    const auto names = attention_kernel_names();
    if (std::find(names.begin(), names.end(), kernel) == names.end()) continue;
    for (bool causal : {false, true}) {
      SCOPED_TRACE(std::string(kernel) + (causal ? " causal" : ""));
      KernelCase c = thread_sweep_case(causal, DType::kF64);
      c.mask = MaskKind::kFloatFull;
      const CaseInputs in = make_inputs(c, 99);
      AttentionOptions options = in.options(c);
      options.kernel = kernel;
      options.return_weights = true;
      options.return_lse = true;
      options.out_dtype = DType::kF64;
      expect_same_bits_for_threads(in, options, {2, 3});
    }
  }
}

}  // namespace
}  // namespace qkv::testing
