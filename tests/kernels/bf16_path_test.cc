// The bf16 path of fused_hwy (vdpbf16ps, src/kernels/fused_bf16-inl.h) against the float64
// reference on the same bf16-rounded Q, K, V: its max error is at most twice that of the plain
// bf16 composition (naive_bf16.h) plus a tiny floor, over head dims 1-128 (odd ones: a pair
// padded with zero), key counts across the 64-key tile edge, GQA, causal/window/masks, fully
// masked rows and the weights/lse outputs, with Q, K, V stored as f32, f64, f16 or bf16. Every
// compiled SIMD target is tried; the path runs only on the AVX-512 ones of a CPU with
// AVX512-BF16 (its products on AMX tiles where the CPU has AMX and d is a multiple of 32,
// fused_amx-inl.h), and the test says which targets it skipped.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "kernel_cases.h"
#include "kernels/kernel.h"
#include "naive_bf16.h"
#include "qkv/attention.h"

namespace qkv::testing {
namespace {

struct Bf16Case {
  KernelCase c;
  bool weights = true;
};

std::vector<Bf16Case> bf16_cases() {
  std::vector<Bf16Case> cases;
  const DType storage[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16};
  int index = 0;
  for (std::int64_t d : {1, 2, 7, 63, 64, 96, 128}) {
    for (std::int64_t nk : {63, 64, 65, 200}) {
      Bf16Case b;
      KernelCase& c = b.c;
      c.d = d;
      c.dv = index % 3 == 0 ? d : d + 9;  // dv off the vector width too
      c.nk = nk;
      c.nq = index % 2 == 0 ? 37 : 70;
      c.in_dtype = storage[index % 4];
      std::string what;
      switch (index % 6) {
        case 0:
          what = "plain";
          break;
        case 1:
          c.causal = true;
          what = "causal";
          break;
        case 2:
          c.window = Window{20, 5};
          what = "window";
          break;
        case 3:
          c.mask = MaskKind::kBoolFull;
          c.causal = true;
          what = "mask_causal";
          break;
        case 4:
          c.mask = MaskKind::kDeadRows;
          what = "dead_rows";
          break;
        default:
          c.mask = MaskKind::kFloatFull;
          what = "float_mask";
          break;
      }
      if (index % 4 == 1) {
        c.h = 6;
        c.hkv = 2;
        what += "_gqa";
      }
      b.weights = index % 5 != 4;  // most with weights, a few without (no second sweep)
      c.name = "d" + std::to_string(d) + "_nk" + std::to_string(nk) + "_" + what + "_" +
               dtype_name(c.in_dtype);
      cases.push_back(b);
      ++index;
    }
  }
  Bf16Case strided;
  strided.c.name = "strided_f32_gqa_causal";
  strided.c.strided = true;
  strided.c.h = 4;
  strided.c.hkv = 2;
  strided.c.nq = 70;
  strided.c.nk = 130;
  strided.c.d = 40;
  strided.c.dv = 24;
  strided.c.causal = true;
  cases.push_back(strided);
  // Past the 512 head dims that pack_kt rounds 16 keys of on the stack: packed key by key.
  Bf16Case wide;
  wide.c.name = "d521_key_by_key";
  wide.c.nq = 9;
  wide.c.nk = 70;
  wide.c.d = 521;
  wide.c.dv = 530;
  wide.c.in_dtype = DType::kF64;
  cases.push_back(wide);
  return cases;
}

class Bf16Path : public ::testing::TestWithParam<Bf16Case> {};

TEST_P(Bf16Path, WithinTwiceThePlainBf16Composition) {
  const KernelCase& c = GetParam().c;
  const CaseInputs in = make_inputs(c, 99);
  AttentionOptions options = in.options(c);
  options.dtype = DType::kBF16;
  options.threads = 2;
  options.return_weights = GetParam().weights;
  options.return_lse = true;

  AttentionOptions ref_options = options;
  ref_options.kernel = "reference";
  ref_options.out_dtype = DType::kF64;
  const AttentionResult ref = attention(in.q, in.k, in.v, ref_options);
  const NaiveResult naive = naive_bf16(in.q, in.k, in.v, options);
  const double naive_out = max_error(naive.out.view(), ref.out.view());
  const double naive_w =
      options.return_weights ? max_error(naive.weights.view(), ref.weights.view()) : 0.0;
  const double naive_lse = max_error(naive.lse.view(), ref.lse.view());
  const double max_v = max_abs(in.v);
  double max_lse = 1.0;
  for (std::int64_t e = 0; e < ref.lse.numel(); ++e) {
    const double x = ref.lse.data_as<double>()[e];
    if (std::isfinite(x)) max_lse = std::max(max_lse, std::abs(x));
  }

  int ran = 0;
  for (std::int64_t target : kernels::simd_targets()) {
    SCOPED_TRACE(kernels::simd_target_name(target));
    kernels::simd_force_target(target);
    const bool amx = kernels::fused_bf16_amx_available(c.d);
    if (!amx && !kernels::fused_bf16_dots_available()) {
      kernels::simd_force_target(0);
      std::cout << "[  SKIP    ] bf16 path on " << kernels::simd_target_name(target)
                << ": not this target, or neither AMX (for this d) nor AVX512-BF16 at full rate"
                   " on this CPU\n";
      continue;
    }
    options.kernel = "fused_hwy";
    EXPECT_NE(explain_kernel_choice(in.q, in.k, in.v, options)
                  .find(amx ? "AMX tiles" : "vdpbf16ps"),
              std::string::npos);
    AttentionResult got;
    if (c.strided) {
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
    ++ran;
    EXPECT_EQ(got.kernel, "fused_hwy");
    const double e_out = max_error(got.out.view(), ref.out.view());
    EXPECT_LE(e_out, 2.0 * naive_out + 1e-7 * max_v) << "naive bf16 error " << naive_out;
    if (options.return_weights) {
      const double e_w = max_error(got.weights.view(), ref.weights.view());
      EXPECT_LE(e_w, 2.0 * naive_w + 1e-7) << "naive bf16 weights error " << naive_w;
    }
    const double e_lse = max_error(got.lse.view(), ref.lse.view());
    EXPECT_LE(e_lse, 2.0 * naive_lse + 1e-7 * max_lse) << "naive bf16 lse error " << naive_lse;
  }
  if (ran == 0) GTEST_SKIP() << "no SIMD target here runs the bf16 path (no AVX512-BF16)";
}

INSTANTIATE_TEST_SUITE_P(Shapes, Bf16Path, ::testing::ValuesIn(bf16_cases()),
                         [](const ::testing::TestParamInfo<Bf16Case>& param) {
                           return param.param.c.name;
                         });

}  // namespace
}  // namespace qkv::testing
