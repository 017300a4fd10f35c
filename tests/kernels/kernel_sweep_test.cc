// Every kernel in the list, on every compiled SIMD target, against the float64 reference over a
// sweep of shapes and options. The criterion (STYLE.md, "tolerances are earned"): a kernel's
// max error is at most twice the naive float32 implementation's on the same inputs, plus a
// floor of 1e-7 · max|V| (1e-7 for the weights, 1e-7 · max(1, |lse|) for the lse).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernel_cases.h"
#include "naive_bf16.h"
#include "kernels/kernel.h"
#include "qkv/error.h"

namespace qkv::testing {
namespace {

std::vector<KernelCase> sweep_cases() {
  std::vector<KernelCase> cases;
  // Head dims 1..257, odd ones included, around the vector widths and the fast paths.
  for (std::int64_t d : {1, 3, 7, 16, 31, 64, 72, 80, 96, 100, 128, 129, 256, 257}) {
    KernelCase c;
    c.name = "d" + std::to_string(d);
    c.d = c.dv = d;
    c.nq = 37;
    c.nk = 70;
    cases.push_back(c);
  }
  // Sequence lengths at the tile boundaries (64 keys, 64 task rows) +-1, Nq != Nk.
  for (auto [nq, nk] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {63, 64}, {64, 65}, {65, 63}, {127, 129}, {129, 128}, {1, 200}, {200, 1}}) {
    for (bool causal : {false, true}) {
      KernelCase c;
      c.name = "n" + std::to_string(nq) + "x" + std::to_string(nk) + (causal ? "_causal" : "");
      c.nq = nq;
      c.nk = nk;
      c.d = 24;
      c.dv = 40;
      c.causal = causal;
      cases.push_back(c);
    }
  }
  auto add = [&](const std::string& name, auto edit) {
    KernelCase c;
    c.name = name;
    c.nq = 70;
    c.nk = 150;
    c.d = 32;
    c.dv = 48;
    edit(c);
    cases.push_back(c);
  };
  add("window", [](KernelCase& c) { c.window = Window{20, 5}; });
  add("window_left_only", [](KernelCase& c) { c.window = Window{70, -1}; });
  add("window_right_only", [](KernelCase& c) { c.window = Window{-1, 3}; });
  add("causal_window", [](KernelCase& c) {
    c.causal = true;
    c.window = Window{33, 0};
  });
  add("causal_nq_gt_nk", [](KernelCase& c) {
    c.causal = true;
    c.nq = 150;
    c.nk = 70;
  });
  add("bool_mask", [](KernelCase& c) { c.mask = MaskKind::kBoolFull; });
  add("bool_mask_broadcast", [](KernelCase& c) { c.mask = MaskKind::kBoolRowBroadcast; });
  add("float_mask", [](KernelCase& c) { c.mask = MaskKind::kFloatFull; });
  add("float_mask_column", [](KernelCase& c) { c.mask = MaskKind::kFloatColumn; });
  add("dead_rows", [](KernelCase& c) { c.mask = MaskKind::kDeadRows; });
  add("mask_and_causal", [](KernelCase& c) {
    c.mask = MaskKind::kBoolFull;
    c.causal = true;
  });
  add("gqa", [](KernelCase& c) {
    c.h = 6;
    c.hkv = 2;
  });
  add("mqa", [](KernelCase& c) {
    c.h = 5;
    c.hkv = 1;
    c.causal = true;
  });
  add("mqa_many_heads", [](KernelCase& c) {
    c.h = 96;
    c.hkv = 1;
    c.nq = 9;
    c.nk = 80;
  });
  add("batch", [](KernelCase& c) {
    c.b = 3;
    c.h = 2;
    c.hkv = 1;
    c.mask = MaskKind::kFloatFull;
  });
  add("huge_logits", [](KernelCase& c) {
    c.magnitude = 30.0;
    c.scale = 1.0;
  });
  add("huge_logits_causal", [](KernelCase& c) {
    c.magnitude = 30.0;
    c.causal = true;
  });
  add("negative_scale", [](KernelCase& c) {
    c.scale = -0.3;
    c.causal = true;
  });
  // Decode shapes: few query rows against keys split into several chunks (>= 1024 keys each),
  // with the causal/window edge, the mask and GQA crossing chunk and block boundaries.
  for (const bool causal : {false, true}) {
    add(std::string("decode_chunks") + (causal ? "_causal" : ""), [&](KernelCase& c) {
      c.nq = 1;
      c.nk = 3100;
      c.h = 8;
      c.hkv = 2;
      c.d = c.dv = 64;
      c.causal = causal;
    });
  }
  add("decode_window_across_chunks", [](KernelCase& c) {
    c.nq = 3;
    c.nk = 2500;
    c.d = 72;
    c.dv = 40;
    c.causal = true;
    c.window = Window{1100, 0};
  });
  add("decode_mask_gqa", [](KernelCase& c) {
    c.nq = 2;
    c.nk = 1500;
    c.h = 4;
    c.hkv = 1;
    c.mask = MaskKind::kFloatFull;
  });
  // Float64 inputs read by the float32 kernels: opted into float32 (by default all-float64
  // calls compute in float64, which f64_path_test holds to a float64 tolerance).
  add("f64_inputs", [](KernelCase& c) {
    c.in_dtype = DType::kF64;
    c.dtype = DType::kF32;
    c.mask = MaskKind::kFloatFull;
  });
  add("strided", [](KernelCase& c) {
    c.strided = true;
    c.h = 4;
    c.hkv = 2;
    c.causal = true;
  });
  add("strided_f64", [](KernelCase& c) {
    c.strided = true;
    c.in_dtype = DType::kF64;
    c.dtype = DType::kF32;
  });
  // 16-bit storage: every kernel widens it to float32 exactly (the reference reads it exactly
  // too, so the float32 criterion applies unchanged). Contiguous and head column blocks, GQA
  // (Q packed for several heads), and mixed dtypes.
  add("f16_inputs", [](KernelCase& c) {
    c.in_dtype = DType::kF16;
    c.mask = MaskKind::kFloatFull;
  });
  add("bf16_inputs", [](KernelCase& c) {
    c.in_dtype = DType::kBF16;
    c.causal = true;
  });
  add("f16_gqa", [](KernelCase& c) {
    c.in_dtype = DType::kF16;
    c.h = 6;
    c.hkv = 2;
    c.dv = 64;  // V rows of whole vectors: the case where float32 V is read in place
  });
  add("bf16_huge_logits", [](KernelCase& c) {
    c.in_dtype = DType::kBF16;
    c.magnitude = 30.0;
    c.scale = 1.0;
  });
  add("strided_f16", [](KernelCase& c) {
    c.strided = true;
    c.in_dtype = DType::kF16;
    c.h = 4;
    c.hkv = 2;
    c.causal = true;
  });
  add("strided_bf16", [](KernelCase& c) {
    c.strided = true;
    c.in_dtype = DType::kBF16;
  });
  add("mixed_f32_f16_bf16", [](KernelCase& c) {
    c.k_dtype = DType::kF16;
    c.v_dtype = DType::kBF16;
    c.d = 64;  // Q read in place: float32, unit column stride, one head per kv head
    c.dv = 64;
  });
  add("mixed_bf16_f32_f16", [](KernelCase& c) {
    c.in_dtype = DType::kBF16;
    c.k_dtype = DType::kF32;
    c.v_dtype = DType::kF16;
    c.mask = MaskKind::kBoolFull;
  });
  add("mixed_f16_f64_f32_strided", [](KernelCase& c) {
    c.strided = true;
    c.in_dtype = DType::kF16;
    c.k_dtype = DType::kF64;
    c.v_dtype = DType::kF32;
  });
  // Long rows, where a sum taken one element at a time loses accuracy.
  add("long_rows_65536", [](KernelCase& c) {
    c.h = c.hkv = 1;
    c.nq = 3;
    c.nk = 65536;
    c.d = c.dv = 4;
  });
  add("long_rows_causal", [](KernelCase& c) {
    c.h = c.hkv = 1;
    c.nq = 5;
    c.nk = 20000;
    c.d = c.dv = 8;
    c.causal = true;
  });
  return cases;
}

class KernelSweep : public ::testing::TestWithParam<KernelCase> {};

TEST_P(KernelSweep, EveryKernelWithinTwiceNaiveFloat32) {
  const KernelCase& c = GetParam();
  const CaseInputs in = make_inputs(c, 1234);
  AttentionOptions options = in.options(c);
  options.threads = 2;
  options.return_weights = true;
  options.return_lse = true;

  AttentionOptions ref_options = options;
  ref_options.kernel = "reference";
  ref_options.out_dtype = DType::kF64;
  const AttentionResult ref = attention(in.q, in.k, in.v, ref_options);
  const NaiveResult naive = naive_f32(in.q, in.k, in.v, options);

  const double max_v = max_abs(in.v);
  double max_lse = 1.0;
  for (std::int64_t e = 0; e < ref.lse.numel(); ++e) {
    const double x = ref.lse.data_as<double>()[e];
    if (std::isfinite(x)) max_lse = std::max(max_lse, std::abs(x));
  }
  const double naive_out = max_error(naive.out.view(), ref.out.view());
  const double naive_w = max_error(naive.weights.view(), ref.weights.view());
  const double naive_lse = max_error(naive.lse.view(), ref.lse.view());
  // Calls that compute in bf16 (16-bit bf16 inputs, by default) on the bf16 path are held to
  // the plain bf16 composition instead (naive_bf16.h).
  const NaiveResult naive16 = naive_bf16(in.q, in.k, in.v, options);
  const double naive16_out = max_error(naive16.out.view(), ref.out.view());

  for (const KernelRun& run : kernel_runs()) {
    SCOPED_TRACE(run.label);
    kernels::simd_force_target(run.target);
    options.kernel = run.kernel;
    const bool bf16_dots = runs_bf16_dots(run.kernel, in.q, in.k, in.v, options);
    AttentionResult got;
    if (c.strided) {
      // Write into a head column block of a wider float32 output.
      const std::int64_t width = c.h * c.dv + 5;
      Tensor wide(DType::kF32, {c.b, c.nq, width}, "O");
      AttentionOutputs outputs;
      outputs.out = MutableTensorView{
          wide.data(), DType::kF32, {c.b, c.h, c.nq, c.dv}, {c.nq * width, c.dv, width, 1}, "O"};
      got.weights = Tensor(DType::kF32, ref.weights.shape(), "weights");
      got.lse = Tensor(DType::kF64, ref.lse.shape(), "lse");
      outputs.weights = got.weights.mutable_view();
      outputs.lse = got.lse.mutable_view();
      got.kernel = attention_into(in.q, in.k, in.v, options, outputs);
      got.out = contiguous_copy(outputs.out, DType::kF32);
    } else {
      got = attention(in.q, in.k, in.v, options);
    }
    kernels::simd_force_target(0);
    EXPECT_EQ(got.kernel, run.kernel);
    const double e_out = max_error(got.out.view(), ref.out.view());
    const double e_w = max_error(got.weights.view(), ref.weights.view());
    const double e_lse = max_error(got.lse.view(), ref.lse.view());
    if (bf16_dots) {
      EXPECT_LE(e_out, 2.0 * naive16_out + 1e-7 * max_v) << "naive bf16 error " << naive16_out;
    } else {
      EXPECT_LE(e_out, 2.0 * naive_out + 1e-7 * max_v) << "naive f32 error " << naive_out;
    }
    EXPECT_LE(e_w, 2.0 * naive_w + 1e-7) << "naive f32 weights error " << naive_w;
    EXPECT_LE(e_lse, 2.0 * naive_lse + 1e-7 * max_lse) << "naive f32 lse error " << naive_lse;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, KernelSweep, ::testing::ValuesIn(sweep_cases()),
                         [](const ::testing::TestParamInfo<KernelCase>& param) {
                           return param.param.name;
                         });

// Fully masked rows follow the contract exactly in every kernel: zero output and weights,
// lse = -inf, never NaN.
TEST(KernelContract, DeadRowsAreZeroWithMinusInfinityLse) {
  KernelCase c;
  c.nq = 9;
  c.nk = 70;
  c.mask = MaskKind::kDeadRows;
  const CaseInputs in = make_inputs(c, 7);
  for (const KernelRun& run : kernel_runs()) {
    SCOPED_TRACE(run.label);
    kernels::simd_force_target(run.target);
    AttentionOptions options = in.options(c);
    options.kernel = run.kernel;
    options.return_weights = true;
    options.return_lse = true;
    const AttentionResult r = attention(in.q, in.k, in.v, options);
    kernels::simd_force_target(0);
    for (std::int64_t h = 0; h < c.h; ++h) {
      for (std::int64_t i = 1; i < c.nq; i += 3) {
        const std::int64_t row = h * c.nq + i;
        EXPECT_EQ(r.lse.data_as<float>()[row], -std::numeric_limits<float>::infinity());
        for (std::int64_t x = 0; x < c.dv; ++x)
          EXPECT_EQ(r.out.data_as<float>()[row * c.dv + x], 0.0f);
        for (std::int64_t j = 0; j < c.nk; ++j) {
          EXPECT_EQ(r.weights.data_as<float>()[row * c.nk + j], 0.0f);
        }
      }
    }
  }
}

// No keys at all: every row is fully masked.
TEST(KernelContract, NoKeysGivesZerosAndMinusInfinityLse) {
  const Tensor q = random_tensor(DType::kF32, {2, 5, 8}, 1);
  const Tensor k(DType::kF32, {2, 0, 8}, "K");
  const Tensor v(DType::kF32, {2, 0, 3}, "V");
  for (const std::string& name : attention_kernel_names()) {
    SCOPED_TRACE(name);
    AttentionOptions options;
    options.return_lse = true;
    options.kernel = name;
    AttentionResult r;
    try {
      r = attention(q.view(), k.view(), v.view(), options);
    } catch (const Error&) {
      continue;  // a kernel may decline the call; the default choice must not
    }
    for (std::int64_t e = 0; e < r.out.numel(); ++e) EXPECT_EQ(r.out.data_as<float>()[e], 0.0f);
    for (std::int64_t e = 0; e < r.lse.numel(); ++e) {
      EXPECT_EQ(r.lse.data_as<float>()[e], -std::numeric_limits<float>::infinity());
    }
  }
  EXPECT_NO_THROW(attention(q.view(), k.view(), v.view()));
}

// The choice report names the chosen kernel and gives a reason for each that declined or was
// passed over: a prefill shape passes the decode kernels by, one query row takes the first.
TEST(KernelChoice, ExplainsTheDefaultAndForcedChoice) {
  KernelCase c;
  const CaseInputs in = make_inputs(c, 3);
  const std::string text = explain_kernel_choice(in.q, in.k, in.v, in.options(c));
  const std::string front = attention_kernel_names().front();
  ASSERT_TRUE(front.starts_with("decode")) << text;
  const std::string reason = front == "decode_hwy"
                                ? std::to_string(c.h / c.hkv * c.nq) + " query rows per kv head"
                                : std::string("the portable twin");
  EXPECT_NE(text.find(front + ": passes: " + reason), std::string::npos) << text;
  EXPECT_EQ(text.find(front + ": chosen"), std::string::npos) << text;
  EXPECT_NE(text.find(": chosen"), std::string::npos) << text;
  KernelCase one_row = c;
  one_row.nq = 1;
  const CaseInputs decode_in = make_inputs(one_row, 4);
  const std::string decode_text =
      explain_kernel_choice(decode_in.q, decode_in.k, decode_in.v, decode_in.options(one_row));
  // The SIMD decode kernel takes it; the portable build's scalar twin always passes.
  if (front == "decode_hwy") {
    EXPECT_NE(decode_text.find("decode_hwy: chosen"), std::string::npos) << decode_text;
  } else {
    EXPECT_NE(decode_text.find("decode_scalar: passes: the portable twin"), std::string::npos)
        << decode_text;
  }
  AttentionOptions forced = in.options(c);
  forced.kernel = "reference";
  const std::string forced_text = explain_kernel_choice(in.q, in.k, in.v, forced);
  EXPECT_NE(forced_text.find("reference: chosen (--kernel)"), std::string::npos) << forced_text;
}

// The float32 kernels decline float64 inputs that float32 cannot hold; the reference takes them.
// Computed in float64 (the default for all-float64 inputs), the fused kernel takes them (1e280:
// its own bound, D·max|Q|·max|K| with max|Q| bounded by 2^32, stays within float64).
TEST(KernelChoice, Float32KernelsDeclineOutOfRangeDoubles) {
  KernelCase c;
  c.in_dtype = DType::kF64;
  CaseInputs in = make_inputs(c, 5);
  in.k_store.data_as<double>()[3] = 1e280;
  AttentionOptions options = in.options(c);
  EXPECT_NE(attention(in.q, in.k, in.v, options).kernel, "reference");
  options.dtype = DType::kF32;
  EXPECT_EQ(attention(in.q, in.k, in.v, options).kernel, "reference");
}

TEST(AccuracyReport, ComparesWithTheReference) {
  KernelCase c;
  const CaseInputs in = make_inputs(c, 11);
  AttentionOptions options = in.options(c);
  options.return_lse = true;
  const AttentionResult r = attention(in.q, in.k, in.v, options);
  const AccuracyReport report = compare_with_reference(in.q, in.k, in.v, options, r);
  EXPECT_EQ(report.kernel, r.kernel);
  EXPECT_GT(report.out.max_abs_reference, 0.0);
  EXPECT_LT(report.out.max_abs_error, 1e-5);
  EXPECT_LT(report.out.max_rel_error, 1e-5);
  ASSERT_TRUE(report.lse.has_value());
  EXPECT_FALSE(report.weights.has_value());
}

}  // namespace
}  // namespace qkv::testing
