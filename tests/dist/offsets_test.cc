// The masking's position offsets (core/params.h), which the ring sets on each block: a call on
// some query rows and some keys, with the offsets of their global positions, gives the whole
// call's rows wherever causal and window confine those rows to those keys. Every kernel that
// honours the offsets (fused_hwy, fused_scalar, reference) is held to it; no MPI needed.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/validate.h"
#include "kernels/kernel.h"
#include "qkv/attention.h"

namespace qkv {
namespace {

TEST(MaskingOffsets, ABlockWithOffsetsGivesTheWholeCallsRows) {
  const std::int64_t h = 2, n = 40, d = 8;
  std::mt19937 rng(25);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<std::size_t>(3 * h * n * d));
  for (float& e : x) e = normal(rng);
  const Shape shape = {h, n, d};
  const auto view = [&](int i, const char* name) {
    return TensorView{x.data() + i * h * n * d, DType::kF32, shape, contiguous_strides(shape),
                      name};
  };
  const TensorView q = view(0, "q"), k = view(1, "k"), v = view(2, "v");
  AttentionOptions options;
  options.causal = true;
  options.window = Window{5, -1};
  options.alibi = true;
  options.softcap = 4.0;
  options.threads = 1;
  const AttentionResult whole = attention(q, k, v, options);

  // Query rows [20, 29) see keys [15, 29) only; the block takes keys [12, 33).
  const std::int64_t q0 = 20, q1 = 29, k0 = 12, k1 = 33;
  for (const auto& kernel : kernels::attention_kernels()) {
    const std::string name(kernel.name);
    if (name != "fused_hwy" && name != "fused_scalar" && name != "reference") continue;
    core::AttentionParams p = core::validate_attention(q, k, v, options).params;
    p.shape.nq = q1 - q0;
    p.shape.nk = k1 - k0;
    p.q.data = x.data() + q0 * d;
    p.k.data = x.data() + h * n * d + k0 * d;
    p.v.data = x.data() + 2 * h * n * d + k0 * d;
    p.masking.q_offset = q0 - (p.shape.nk - p.shape.nq);
    p.masking.k_offset = k0;
    std::vector<float> out(static_cast<std::size_t>(h * p.shape.nq * d));
    p.out = {out.data(), DType::kF32, core::Strides4{p.shape.nq * d, p.shape.nq * d, d, 1}};
    ASSERT_EQ(kernel.declines(p), "") << name;
    ASSERT_EQ(kernel.run(p), core::KernelStatus::kOk) << name;
    const float* want = whole.out.data_as<float>();
    for (std::int64_t ih = 0; ih < h; ++ih) {
      for (std::int64_t i = 0; i < p.shape.nq; ++i) {
        for (std::int64_t c = 0; c < d; ++c) {
          EXPECT_NEAR(out[static_cast<std::size_t>((ih * p.shape.nq + i) * d + c)],
                      want[(ih * n + q0 + i) * d + c], 2e-6)
              << name << " head " << ih << " row " << q0 + i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace qkv
