// The masking's position offsets (core/params.h), which the ring sets on each block: a call on
// some query rows and some keys, with the offsets of their global positions, gives the whole
// call's rows wherever causal and window confine those rows to those keys. Every kernel that
// honours the offsets (fused_hwy, fused_scalar, reference) is held to it, and every backward
// kernel (the ring's backward calls them block by block); no MPI needed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/validate.h"
#include "core/validate_backward.h"
#include "kernels/backward_kernel.h"
#include "kernels/kernel.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"

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

// The backward of a block: query rows [20, 29) see keys [15, 29) only (causal, a left window of
// 5); the block takes keys [12, 33) with the whole forward's O and lse rows. Every backward
// kernel on the block, with the offsets, gives the whole call's dQ rows, and the whole call's dK
// and dV rows for keys [20, 24), which only queries of [20, 29) see. Float64: every kernel within
// 1e-12 of the float64 reference on the whole call; float32 (the same inputs computed in
// float32): within 2e-5 relative, the forward offsets test's bound scaled to the gradients.
// With the whole rows' statistics given (as the ring gives them) the same holds.
TEST(MaskingOffsets, ABackwardBlockWithOffsetsGivesTheWholeCallsGradients) {
  const std::int64_t h = 2, hkv = 1, n = 40, d = 8, dv = 6;
  std::mt19937 rng(26);
  std::normal_distribution<double> normal;
  const auto random = [&](const Shape& shape, const char* name) {
    Tensor t(DType::kF64, shape, name);
    for (std::int64_t e = 0; e < t.numel(); ++e) t.data_as<double>()[e] = normal(rng);
    return t;
  };
  const Tensor q = random({h, n, d}, "q"), k = random({hkv, n, d}, "k"),
               v = random({hkv, n, dv}, "v"), dout = random({h, n, dv}, "dout");
  Tensor sinks(DType::kF64, {h}, "sinks");
  sinks.data_as<double>()[0] = 0.5;
  sinks.data_as<double>()[1] = -1.0;
  AttentionOptions options;
  options.causal = true;
  options.window = Window{5, -1};
  options.alibi = true;
  options.softcap = 4.0;
  options.sinks = sinks.view();
  options.threads = 1;
  options.return_lse = true;
  options.out_dtype = DType::kF64;
  options.kernel = "reference";
  const AttentionResult forward = attention(q.view(), k.view(), v.view(), options);
  options.kernel = "reference";
  const AttentionGradients whole = attention_backward(
      q.view(), k.view(), v.view(), forward.out.view(), forward.lse.view(), dout.view(), options);

  const std::int64_t q0 = 20, q1 = 29, k0 = 12, k1 = 33, nq = q1 - q0, nk = k1 - k0;
  for (const DType compute : {DType::kF64, DType::kF32}) {
    AttentionOptions o = options;
    o.kernel.clear();
    o.dtype = compute;
    const double tol = compute == DType::kF64 ? 1e-12 : 2e-5;
    for (const auto& kernel : kernels::backward_kernels()) {
      const std::string name =
          std::string(kernel.name) + (compute == DType::kF64 ? " f64" : " f32");
      core::BackwardCall call = core::validate_attention_backward(
          q.view(), k.view(), v.view(), forward.out.view(), forward.lse.view(), dout.view(), o);
      core::BackwardParams& bp = call.params;
      core::AttentionParams& p = bp.forward;
      p.shape.nq = nq;
      p.shape.nk = nk;
      p.q.data = q.data_as<double>() + q0 * d;
      p.k.data = k.data_as<double>() + k0 * d;
      p.v.data = v.data_as<double>() + k0 * dv;
      p.masking.q_offset = q0 - (nk - nq);
      p.masking.k_offset = k0;
      bp.out.data = forward.out.data_as<double>() + q0 * dv;
      bp.lse.data = forward.lse.data_as<double>() + q0;
      bp.grad_out.data = dout.data_as<double>() + q0 * dv;
      const bool wide = p.compute == DType::kF64;
      const DType grad = wide ? DType::kF64 : DType::kF32;
      Tensor dq(grad, {h, nq, d}, "dq"), dk(grad, {hkv, nk, d}, "dk"),
          dv_t(grad, {hkv, nk, dv}, "dv");
      const auto slot = [](Tensor& t) {
        const MutableTensorView view = t.mutable_view();
        return core::OutputOperand{view.data, view.dtype, core::canonical_strides(view.strides)};
      };
      bp.dq = slot(dq);
      bp.dk = slot(dk);
      bp.dv = slot(dv_t);
      ASSERT_EQ(kernel.declines(bp), "") << name;
      ASSERT_EQ(kernel.run(bp), core::KernelStatus::kOk) << name;
      const auto at = [&](const Tensor& t, std::int64_t e) {
        return wide ? t.data_as<double>()[e] : static_cast<double>(t.data_as<float>()[e]);
      };
      const auto check = [&](const Tensor& got, const Tensor& want, std::int64_t heads,
                             std::int64_t rows, std::int64_t row0, std::int64_t first,
                             std::int64_t last, std::int64_t cols, const char* what) {
        double scale = 1.0;
        for (std::int64_t e = 0; e < want.numel(); ++e) {
          scale = std::max(scale, std::abs(want.data_as<double>()[e]));
        }
        for (std::int64_t ih = 0; ih < heads; ++ih) {
          for (std::int64_t i = first; i < last; ++i) {
            for (std::int64_t c = 0; c < cols; ++c) {
              EXPECT_NEAR(at(got, (ih * rows + i) * cols + c),
                          want.data_as<double>()[(ih * n + row0 + i) * cols + c], tol * scale)
                  << name << " " << what << " head " << ih << " row " << row0 + i;
            }
          }
        }
      };
      // The whole rows' statistics given, as the ring's backward gives them, here in an
      // equivalent form (row_max = the saved lse, row_sum = 1, delta = D = dO·O; the ring gives
      // the merged max, sum and Σ P∘dP): the same gradients within the same bounds (not the
      // same bits). The reference reads none.
      std::vector<double> delta(static_cast<std::size_t>(h * nq));
      for (std::int64_t ih = 0; ih < h; ++ih) {
        for (std::int64_t i = 0; i < nq; ++i) {
          double dot = 0.0;
          for (std::int64_t c = 0; c < dv; ++c) {
            const std::int64_t e = (ih * n + q0 + i) * dv + c;
            dot += dout.data_as<double>()[e] * forward.out.data_as<double>()[e];
          }
          delta[static_cast<std::size_t>(ih * nq + i)] = dot;
        }
      }
      core::BackwardParams given = bp;
      given.delta = {delta.data(), DType::kF64, core::Strides4{nq, nq, 1, 0}};
      const std::vector<double> ones(static_cast<std::size_t>(h * nq), 1.0);
      given.row_max = bp.lse;
      given.row_sum = {ones.data(), DType::kF64, core::Strides4{nq, nq, 1, 0}};
      Tensor dq2(grad, {h, nq, d}, "dq"), dk2(grad, {hkv, nk, d}, "dk"),
          dv2(grad, {hkv, nk, dv}, "dv");
      given.dq = slot(dq2);
      given.dk = slot(dk2);
      given.dv = slot(dv2);
      ASSERT_EQ(kernel.run(given), core::KernelStatus::kOk) << name;
      check(dq2, whole.dq, h, nq, q0, 0, nq, d, "dQ (statistics given)");
      check(dk2, whole.dk, hkv, nk, k0, 20 - k0, 24 - k0, d, "dK (statistics given)");
      check(dv2, whole.dv, hkv, nk, k0, 20 - k0, 24 - k0, dv, "dV (statistics given)");
      check(dq, whole.dq, h, nq, q0, 0, nq, d, "dQ");
      check(dk, whole.dk, hkv, nk, k0, 20 - k0, 24 - k0, d, "dK");
      check(dv_t, whole.dv, hkv, nk, k0, 20 - k0, 24 - k0, dv, "dV");
    }
  }
}

}  // namespace
}  // namespace qkv
