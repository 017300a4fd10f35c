// attention() checks K and V in the kernel's own pass instead of a scan before it
// (kernels/attention.cc, checks_kv_as_it_reads): the decode kernel on few query rows, the fused
// kernel (as it packs each key tile) on the rest. Held against the same call
// written with an unbounded window, which still scans first: the same error, word for word, for a
// NaN, an infinity or a value past float16's range anywhere in K or V; the same bits when the
// inputs are fine, and when they are finite but large (2^32 and more: the kernel flags them and the
// call reruns with the scan's true bounds).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/half.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv {
namespace {

using testing::random_tensor;
using testing::same_bytes;

struct Case {
  const char* name;
  std::int64_t nq;
  bool causal;
  std::optional<Window> window;
  DType kv_dtype;
  std::int64_t d;
  std::int64_t kv_heads = 2;  // of 8 query heads
  const char* kernel = "decode_hwy";  // the SIMD kernel that checks this call (no window)
  bool interleaved = false;  // K and V views of [B, Nk, Hkv, D] memory, as transformers has them

  std::int64_t kv_elements() const { return kv_heads * 700 * d; }
};

// K or V for a case: contiguous [1, Hkv, 700, D], or (interleaved) a [1, 700, Hkv, D] tensor
// whose view the test reads, made contiguous again for set() by kv_view.
Tensor kv_tensor(const Case& c, std::uint64_t seed) {
  return c.interleaved ? random_tensor(c.kv_dtype, {1, 700, c.kv_heads, c.d}, seed)
                       : random_tensor(c.kv_dtype, {1, c.kv_heads, 700, c.d}, seed);
}

TensorView kv_view(const Case& c, const Tensor& t) {
  TensorView view = t.view();
  if (c.interleaved) {
    std::swap(view.shape[1], view.shape[2]);
    std::swap(view.strides[1], view.strides[2]);
  }
  return view;
}

// attention() as asked (the kernel checks K and V) and the same call with an unbounded window
// in place of "no window" (every key allowed, or causal's keys: the same scores, the same kernel
// and bits), which validation scans first: attention() defers the scan only without a window.
struct Both {
  std::string error_plain, error_into;  // error_into: the scanned call's
  Tensor out_plain, out_into;
  std::string kernel_plain, kernel_into;
};

Both run_both(const Tensor& q, const Tensor& k_tensor, const Tensor& v_tensor, const Case& c) {
  const TensorView k = kv_view(c, k_tensor);
  const TensorView v = kv_view(c, v_tensor);
  AttentionOptions options;
  options.causal = c.causal;
  options.window = c.window;
  options.threads = 2;
  options.return_lse = true;
  AttentionOptions scanned = options;
  if (!c.window) {
    constexpr std::int64_t kAll = std::int64_t{1} << 40;
    scanned.window = Window{kAll, c.causal ? 0 : kAll};
    scanned.causal = false;
  }
  Both both;
  try {
    AttentionResult r = attention(q.view(), k, v, options);
    both.out_plain = std::move(r.out);
    both.kernel_plain = r.kernel;
  } catch (const Error& e) {
    both.error_plain = e.what();
  }
  try {
    AttentionResult r = attention(q.view(), k, v, scanned);
    both.out_into = std::move(r.out);
    both.kernel_into = r.kernel;
  } catch (const Error& e) {
    both.error_into = e.what();
  }
  return both;
}

void set(Tensor& t, std::int64_t flat, double value) {
  switch (t.dtype()) {
    case DType::kF32:
      t.data_as<float>()[flat] = static_cast<float>(value);
      break;
    case DType::kBF16:
      static_cast<std::uint16_t*>(t.data())[flat] = core::float_to_bf16(static_cast<float>(value));
      break;
    case DType::kF16:
      static_cast<std::uint16_t*>(t.data())[flat] = core::float_to_f16(static_cast<float>(value));
      break;
    default:
      t.data_as<double>()[flat] = value;
  }
}

// The SIMD decode kernel runs in this build (the portable build has none: every call is then
// scanned first, and these tests hold that path too).
bool has_simd_kernels() {
  const Tensor q = random_tensor(DType::kF32, {1, 1, 1, 16}, 1);
  const Tensor k = random_tensor(DType::kF32, {1, 1, 64, 16}, 2);
  try {
    return explain_kernel_choice(q.view(), k.view(), k.view(), AttentionOptions{})
               .find("decode_hwy: chosen") != std::string::npos;
  } catch (const Error&) {
    return false;
  }
}

const Case kCases[] = {
    {"one row, GQA", 1, false, std::nullopt, DType::kF32, 64},
    {"three causal rows", 3, true, std::nullopt, DType::kF32, 64},
    {"d not a whole vector", 1, false, std::nullopt, DType::kF32, 40},
    {"float64 K and V", 2, false, std::nullopt, DType::kF64, 32},
    {"a window (scanned first)", 1, false, Window{8, 0}, DType::kF32, 64},
    // 16-bit rows, which the SIMD kernel widens into float32 before it reads them: one query
    // row per kv head (d a whole vector or not) and GQA.
    {"bfloat16 K and V, one row per kv head", 1, false, std::nullopt, DType::kBF16, 64, 8},
    {"float16 K and V, one row per kv head", 1, false, std::nullopt, DType::kF16, 128, 8},
    {"bfloat16, d not a whole vector", 1, true, std::nullopt, DType::kBF16, 40, 8},
    {"float16 K and V, GQA", 2, true, std::nullopt, DType::kF16, 64},
    // Many query rows: the fused kernel, which checks each key tile's rows as it packs them.
    {"fused: 96 rows, GQA", 96, false, std::nullopt, DType::kF32, 64, 2, "fused_hwy"},
    {"fused: causal, d not a whole vector", 80, true, std::nullopt, DType::kF32, 40, 8,
     "fused_hwy"},
    {"fused: float64 K and V", 70, false, std::nullopt, DType::kF64, 32, 2, "fused_hwy"},
    {"fused: bfloat16 K and V", 70, true, std::nullopt, DType::kBF16, 64, 8, "fused_hwy"},
    {"fused: float16 K and V", 70, false, std::nullopt, DType::kF16, 64, 2, "fused_hwy"},
    {"fused: heads interleaved (strided rows)", 128, false, std::nullopt, DType::kF32, 32, 8,
     "fused_hwy", true},
    {"fused: a window (scanned first)", 128, true, Window{40, 0}, DType::kF32, 64, 2,
     "fused_hwy"},
};

TEST(KvInputCheck, FineInputsGiveTheBitsOfTheScannedCall) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const Tensor q = random_tensor(DType::kF32, {1, 8, c.nq, c.d}, 1);
    const Tensor k = kv_tensor(c, 2);
    const Tensor v = kv_tensor(c, 3);
    const Both both = run_both(q, k, v, c);
    ASSERT_EQ(both.error_plain, "");
    ASSERT_EQ(both.error_into, "");
    EXPECT_EQ(both.kernel_plain, both.kernel_into);
    EXPECT_TRUE(same_bytes(both.out_plain, both.out_into));
    if (!c.window && has_simd_kernels()) {
      EXPECT_EQ(both.kernel_plain, c.kernel) << "the path under test was not taken";
    }
  }
}

TEST(KvInputCheck, ABadElementAnywhereIsNamedAsTheScanNamesIt) {
  const double kBad[] = {std::numeric_limits<double>::quiet_NaN(),
                         std::numeric_limits<double>::infinity(),
                         -std::numeric_limits<double>::infinity()};
  for (const Case& c : kCases) {
    for (const bool in_v : {false, true}) {
      // The first key, one in the middle, the very last element (past the window of every row
      // but the last's, and in the last block of the last chunk).
      for (const std::int64_t at :
           {std::int64_t{0}, c.kv_elements() / 4 + 7, c.kv_elements() - 1}) {
        for (const double bad : kBad) {
          SCOPED_TRACE(std::string(c.name) + (in_v ? ", V" : ", K") + " at " + std::to_string(at) +
                       " = " + std::to_string(bad));
          const Tensor q = random_tensor(DType::kF32, {1, 8, c.nq, c.d}, 1);
          Tensor k = kv_tensor(c, 2);
          Tensor v = kv_tensor(c, 3);
          set(in_v ? v : k, at, bad);
          const Both both = run_both(q, k, v, c);
          EXPECT_NE(both.error_into, "");
          EXPECT_EQ(both.error_plain, both.error_into);
        }
      }
    }
  }
}

// V rows of keys that a boolean mask hides from every query row before any allowed key are
// never multiplied by a weight (P·V skips them); the kernel still checks them, as the scan
// would have.
// Likewise a NaN in V where every weight is 0 (a key scored far below the others), which P·V
// multiplies by 0: NaN · 0 is NaN, so it still shows.
TEST(KvInputCheck, ABadValueNoWeightReachesIsNamedToo) {
  const std::int64_t d = 64, nk = 700;
  const Tensor q = random_tensor(DType::kF32, {1, 8, 1, d}, 1);
  Tensor mask(DType::kBool, {1, 1, 1, nk}, "mask");
  for (std::int64_t j = 0; j < nk; ++j) mask.data_as<bool>()[j] = j >= 64;
  // float32 with 4 query rows per kv head; bfloat16 (widened first) with one.
  for (const auto& [dtype, kv_heads] :
       {std::pair{DType::kF32, std::int64_t{2}}, std::pair{DType::kBF16, std::int64_t{8}}}) {
    for (const bool masked : {true, false}) {
      SCOPED_TRACE(std::string(dtype == DType::kF32 ? "float32" : "bfloat16") +
                   (masked ? ", keys 0..63 masked for every row" : ", a key scored 1e4 below"));
      Tensor k = random_tensor(dtype, {1, kv_heads, nk, d}, 2);
      Tensor v = random_tensor(dtype, {1, kv_heads, nk, d}, 3);
      if (!masked) {
        // Key 40 of kv head 0 far below every other: its weight is exactly 0 in every row.
        for (std::int64_t c = 0; c < d; ++c) {
          set(k, 40 * d + c, -1e4 * (q.data_as<float>()[c] > 0 ? 1.0 : -1.0));
        }
      }
      set(v, 40 * d + 5, std::numeric_limits<double>::quiet_NaN());
      AttentionOptions options;
      options.threads = 2;
      if (masked) options.mask = mask.view();
      AttentionOptions scanned = options;
      scanned.window = Window{std::int64_t{1} << 40, std::int64_t{1} << 40};
      std::string plain, into;
      try {
        attention(q.view(), k.view(), v.view(), options);
      } catch (const Error& e) {
        plain = e.what();
      }
      try {
        attention(q.view(), k.view(), v.view(), scanned);
      } catch (const Error& e) {
        into = e.what();
      }
      EXPECT_NE(into, "");
      EXPECT_EQ(plain, into);
    }
  }
}

TEST(KvInputCheck, LargeFiniteValuesRunAgainWithTheirTrueBounds) {
  // 2^32 and beyond: the kernel flags them; the rerun has the scan's magnitudes and so the
  // kernel choice and the bits of the scanned call. 1e30 in K makes float32 scores overflow:
  // that call must leave the decode kernel for the float64 reference, on both paths.
  for (const double large : {4294967296.0, 1e12, -3e20, 1e30}) {
    for (const Case& c : kCases) {
      for (const bool in_v : {false, true}) {
        SCOPED_TRACE(std::string(c.name) + (in_v ? ", V" : ", K") + " = " + std::to_string(large));
        const Tensor q = random_tensor(DType::kF32, {1, 8, c.nq, c.d}, 1);
        Tensor k = kv_tensor(c, 2);
        Tensor v = kv_tensor(c, 3);
        set(in_v ? v : k, c.kv_elements() - 3, large);
        const Both both = run_both(q, k, v, c);
        ASSERT_EQ(both.error_plain, both.error_into);
        if (!both.error_into.empty()) continue;
        EXPECT_EQ(both.kernel_plain, both.kernel_into);
        EXPECT_TRUE(same_bytes(both.out_plain, both.out_into)) << "kernel " << both.kernel_plain;
        for (std::int64_t i = 0; i < both.out_plain.numel(); ++i) {
          ASSERT_FALSE(std::isnan(both.out_plain.data_as<float>()[i])) << "element " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace qkv
