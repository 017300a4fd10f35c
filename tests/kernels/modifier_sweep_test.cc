// Every kernel in the list that accepts a call with the version-2 options (softcap, ALiBi,
// sinks, storage dtype, packed batches), on every compiled SIMD target, against the float64
// reference on the same (rounded) inputs. A kernel that declines ("cannot run this call") is
// skipped, not failed: the list grows as kernels learn the options. The criterion, as in
// kernel_sweep_test.cc: each error at most twice the naive composition's in the call's precision
// (modifier_cases.h: float32, or bf16 with P rounded to bf16), plus a floor of 1e-7 · max|V|
// (1e-7 for the weights, 1e-7 · max(1, |lse|) for the lse).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "modifier_cases.h"
#include "qkv/error.h"

namespace qkv::testing {
namespace {

std::vector<ModCase> modifier_cases() {
  std::vector<ModCase> cases;
  auto add = [&](const std::string& name, auto edit) {
    ModCase c;
    c.base.name = name;
    c.base.nq = 37;
    c.base.nk = 70;
    c.base.d = 32;
    c.base.dv = 24;
    c.softcap = 5.0;
    c.alibi = true;
    c.sinks = true;
    edit(c);
    cases.push_back(c);
  };
  // Head dims around the vector widths, every modifier on.
  for (const std::int64_t d : {1, 7, 64, 65, 128}) {
    add("d" + std::to_string(d), [&](ModCase& c) { c.base.d = c.base.dv = d; });
  }
  // Key-tile edges (64 keys a tile), causal: the ALiBi distance and the diagonal cross tiles.
  for (const std::int64_t nk : {63, 64, 65, 130}) {
    add("nk" + std::to_string(nk) + "_causal", [&](ModCase& c) {
      c.base.nk = nk;
      c.base.nq = 20;
      c.base.causal = true;
    });
  }
  add("gqa_h4_hkv2", [](ModCase& c) {
    c.base.h = 4;
    c.base.hkv = 2;
    c.given_slopes = true;
    c.alibi = false;
  });
  add("mqa_h4_hkv1", [](ModCase& c) {
    c.base.h = 4;
    c.base.hkv = 1;
    c.base.causal = true;
  });
  add("softcap_only_causal", [](ModCase& c) {
    c.alibi = c.sinks = false;
    c.base.causal = true;
  });
  add("alibi_only_window", [](ModCase& c) {
    c.softcap = 0;
    c.sinks = false;
    c.base.window = Window{20, 3};
  });
  add("sinks_only_bool_mask", [](ModCase& c) {
    c.softcap = 0;
    c.alibi = false;
    c.base.mask = MaskKind::kBoolFull;
  });
  add("float_mask_all", [](ModCase& c) { c.base.mask = MaskKind::kFloatFull; });
  add("float_column_mask_sinks", [](ModCase& c) { c.base.mask = MaskKind::kFloatColumn; });
  add("dead_rows_with_sinks", [](ModCase& c) { c.base.mask = MaskKind::kDeadRows; });
  add("dead_rows_without_sinks", [](ModCase& c) {
    c.base.mask = MaskKind::kDeadRows;
    c.sinks = false;
  });
  add("causal_window_given_slopes", [](ModCase& c) {
    c.base.causal = true;
    c.base.window = Window{30, 0};
    c.alibi = false;
    c.given_slopes = true;
  });
  add("huge_logits_capped", [](ModCase& c) {
    c.base.magnitude = 30.0;
    c.base.scale = 1.0;
    c.softcap = 30.0;
  });
  add("nq_gt_nk_causal", [](ModCase& c) {
    c.base.nq = 70;
    c.base.nk = 37;
    c.base.causal = true;  // the first 33 rows have no key: lse = sink
  });
  // Storage types: stored in 16 bits, or rounded to them from float32 / float64 (dtype).
  add("f16_inputs", [](ModCase& c) { c.base.in_dtype = DType::kF16; });
  add("bf16_inputs", [](ModCase& c) { c.base.in_dtype = DType::kBF16; });
  add("bf16_inputs_plain", [](ModCase& c) {
    c.base.in_dtype = DType::kBF16;
    c.softcap = 0;
    c.alibi = c.sinks = false;
    c.base.causal = true;
  });
  add("f32_rounded_to_bf16", [](ModCase& c) { c.dtype = DType::kBF16; });
  add("f32_rounded_to_f16", [](ModCase& c) { c.dtype = DType::kF16; });
  add("f32_rounded_to_bf16_plain_d128", [](ModCase& c) {
    c.dtype = DType::kBF16;
    c.softcap = 0;
    c.alibi = c.sinks = false;
    c.base.d = c.base.dv = 128;
  });
  add("f64_rounded_to_bf16_gqa", [](ModCase& c) {
    c.base.in_dtype = DType::kF64;
    c.dtype = DType::kBF16;
    c.base.h = 4;
    c.base.hkv = 2;
  });
  add("bf16_rounded_to_f16", [](ModCase& c) {
    c.base.in_dtype = DType::kBF16;
    c.dtype = DType::kF16;
    c.base.mask = MaskKind::kFloatFull;
  });
  add("mixed_f16_bf16_default_f32", [](ModCase& c) {
    c.base.in_dtype = DType::kF16;
    c.base.k_dtype = DType::kBF16;
  });
  add("decode_rows", [](ModCase& c) {
    c.base.nq = 1;
    c.base.nk = 1500;
    c.base.h = 8;
    c.base.hkv = 2;
    c.base.d = c.base.dv = 64;
    c.base.causal = true;
  });
  // Packed batches: empty sequences on either side, Nq < Nk and Nq > Nk.
  add("packed_causal", [](ModCase& c) {
    c.base.h = 4;
    c.base.hkv = 2;
    c.base.causal = true;
    c.packed_q = {10, 0, 20, 7};
    c.packed_k = {25, 15, 30, 0};
  });
  add("packed_window_bf16", [](ModCase& c) {
    c.base.window = Window{5, 2};
    c.dtype = DType::kBF16;
    c.packed_q = {3, 30, 4};
    c.packed_k = {40, 20, 10};
  });
  return cases;
}

class ModifierSweep : public ::testing::TestWithParam<ModCase> {};

TEST_P(ModifierSweep, EveryAcceptingKernelWithinTwiceTheNaiveComposition) {
  const ModCase& c = GetParam();
  ModInputs in = make_mod_inputs(c, 4321);
  AttentionOptions& options = in.options;
  options.threads = 2;
  options.return_weights = c.packed_q.empty();
  options.return_lse = true;

  AttentionOptions ref_options = options;
  ref_options.kernel = "reference";
  ref_options.out_dtype = DType::kF64;
  const AttentionResult ref = attention(in.q, in.k, in.v, ref_options);
  const NaiveResult naive = naive_modified(in.q, in.k, in.v, options);

  const double max_v = max_abs(in.v);
  double max_lse = 1.0;
  for (std::int64_t e = 0; e < ref.lse.numel(); ++e) {
    const double x = ref.lse.data_as<double>()[e];
    if (std::isfinite(x)) max_lse = std::max(max_lse, std::abs(x));
  }
  const double naive_out = max_error(naive.out.view(), ref.out.view());
  const double naive_lse = max_error(naive.lse.view(), ref.lse.view());
  const double naive_w =
      options.return_weights ? max_error(naive.weights.view(), ref.weights.view()) : 0.0;
  // The yardstick itself is sound: close to the reference (bf16 P: 2^-8 relative).
  EXPECT_LT(naive_out, 1e-2 * std::max(1.0, max_v));

  std::set<std::string> ran;
  for (const KernelRun& run : kernel_runs()) {
    SCOPED_TRACE(run.label);
    kernels::simd_force_target(run.target);
    options.kernel = run.kernel;
    AttentionResult got;
    try {
      got = attention(in.q, in.k, in.v, options);
    } catch (const Error& e) {
      kernels::simd_force_target(0);
      EXPECT_NE(std::string(e.what()).find("cannot run this call"), std::string::npos) << e.what();
      continue;
    }
    kernels::simd_force_target(0);
    ran.insert(run.kernel);
    EXPECT_EQ(got.kernel, run.kernel);
    const double e_out = max_error(got.out.view(), ref.out.view());
    const double e_lse = max_error(got.lse.view(), ref.lse.view());
    EXPECT_LE(e_out, 2.0 * naive_out + 1e-7 * max_v) << "naive error " << naive_out;
    EXPECT_LE(e_lse, 2.0 * naive_lse + 1e-7 * max_lse) << "naive lse error " << naive_lse;
    if (options.return_weights) {
      const double e_w = max_error(got.weights.view(), ref.weights.view());
      EXPECT_LE(e_w, 2.0 * naive_w + 1e-7) << "naive weights error " << naive_w;
    }
  }
  EXPECT_TRUE(ran.count("reference")) << "the reference must take every call";
  // Which kernels took the case, for the log (the fused kernels join as they learn the options).
  std::string names;
  for (const std::string& n : ran) names += " " + n;
  RecordProperty("kernels", names);
}

INSTANTIATE_TEST_SUITE_P(Modifiers, ModifierSweep, ::testing::ValuesIn(modifier_cases()),
                         [](const ::testing::TestParamInfo<ModCase>& param) {
                           return param.param.base.name;
                         });

// Rows with no allowed key follow the contract exactly in every kernel that takes the call:
// zero output and weights, and lse = sink_h (with sinks) or -inf (without).
TEST(ModifierContract, DeadRowsAreZeroWithLseSinkOrMinusInfinity) {
  for (const bool sinks : {true, false}) {
    ModCase c;
    c.base.nq = 9;
    c.base.nk = 70;
    c.base.h = 4;
    c.base.hkv = 2;
    c.base.mask = MaskKind::kDeadRows;
    c.softcap = 3.0;
    c.alibi = true;
    c.sinks = sinks;
    ModInputs in = make_mod_inputs(c, 8);
    in.options.return_weights = in.options.return_lse = true;
    for (const KernelRun& run : kernel_runs()) {
      SCOPED_TRACE(run.label + (sinks ? " sinks" : " no sinks"));
      kernels::simd_force_target(run.target);
      in.options.kernel = run.kernel;
      AttentionResult r;
      try {
        r = attention(in.q, in.k, in.v, in.options);
      } catch (const Error& e) {
        kernels::simd_force_target(0);
        EXPECT_NE(std::string(e.what()).find("cannot run this call"), std::string::npos);
        continue;
      }
      kernels::simd_force_target(0);
      for (std::int64_t h = 0; h < c.base.h; ++h) {
        const float want = sinks ? in.sinks.data_as<float>()[h]
                                 : -std::numeric_limits<float>::infinity();
        for (std::int64_t i = 1; i < c.base.nq; i += 3) {
          const std::int64_t row = h * c.base.nq + i;
          EXPECT_EQ(r.lse.data_as<float>()[row], want) << "row " << row;
          for (std::int64_t x = 0; x < c.base.dv; ++x) {
            EXPECT_EQ(r.out.data_as<float>()[row * c.base.dv + x], 0.0f);
          }
          for (std::int64_t j = 0; j < c.base.nk; ++j) {
            EXPECT_EQ(r.weights.data_as<float>()[row * c.base.nk + j], 0.0f);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace qkv::testing
