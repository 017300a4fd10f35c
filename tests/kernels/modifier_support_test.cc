// The fused kernels take the version-2 options: fused_hwy (in SIMD builds, on every compiled
// target) and fused_scalar must accept softcap + ALiBi + sinks with Q, K, V rounded to bf16 or
// f16, given ALiBi slopes, and packed batches, instead of declining them to the reference. How
// accurate they are is modifier_sweep_test.cc's business; this file only says that they run.
// It fails until the fused kernels learn the options (merge it last).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "modifier_cases.h"
#include "qkv/error.h"

namespace qkv::testing {
namespace {

std::vector<KernelRun> fused_runs() {
  std::vector<KernelRun> runs;
  for (const KernelRun& run : kernel_runs()) {
    if (run.kernel == "fused_hwy" || run.kernel == "fused_scalar") runs.push_back(run);
  }
  return runs;
}

TEST(FusedKernels, TakeEveryScoreModifier) {
  const std::vector<std::string> names = attention_kernel_names();
  ASSERT_NE(std::find(names.begin(), names.end(), "fused_scalar"), names.end());
  const bool simd = !kernels::simd_targets().empty();
  EXPECT_EQ(std::find(names.begin(), names.end(), "fused_hwy") != names.end(), simd);

  std::vector<std::pair<std::string, ModCase>> calls;
  ModCase all;
  all.base.nq = 20;
  all.base.nk = 70;
  all.base.h = 4;
  all.base.hkv = 2;
  all.base.causal = true;
  all.softcap = 5.0;
  all.alibi = true;
  all.sinks = true;
  for (const DType d : {DType::kBF16, DType::kF16}) {
    ModCase c = all;
    c.dtype = d;
    calls.emplace_back(std::string("softcap_alibi_sinks_f32_to_") + dtype_name(d), c);
  }
  ModCase stored = all;
  stored.base.in_dtype = DType::kBF16;
  calls.emplace_back("softcap_alibi_sinks_bf16_stored", stored);
  ModCase given = all;
  given.alibi = false;
  given.given_slopes = true;
  given.base.mask = MaskKind::kFloatFull;
  calls.emplace_back("given_slopes_float_mask", given);
  ModCase packed = all;
  packed.packed_q = {5, 0, 15};
  packed.packed_k = {30, 10, 30};
  packed.dtype = DType::kBF16;
  calls.emplace_back("packed_bf16", packed);

  for (const auto& [label, c] : calls) {
    ModInputs in = make_mod_inputs(c, 99);
    in.options.return_lse = true;
    for (const KernelRun& run : fused_runs()) {
      SCOPED_TRACE(label + " " + run.label);
      kernels::simd_force_target(run.target);
      in.options.kernel = run.kernel;
      try {
        EXPECT_EQ(attention(in.q, in.k, in.v, in.options).kernel, run.kernel);
      } catch (const Error& e) {
        ADD_FAILURE() << run.label << " declined: " << e.what();
      }
      kernels::simd_force_target(0);
    }
  }
}

}  // namespace
}  // namespace qkv::testing
