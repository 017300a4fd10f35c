// Validation of 16-bit inputs: the finiteness scan finds a NaN or an infinity in bfloat16 and
// float16 views (contiguous, column blocks, and strided views walked element by element), names
// the tensor and the element, and bounds the magnitudes as the float32 kernels expect.
#include "core/validate.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/half.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv {
namespace {

std::string message_of(const TensorView& view) {
  try {
    core::require_finite(view);
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), view.name);
    return e.problem();
  }
  return "";
}

TEST(ValidateSixteenBit, NonFiniteElementsAreNamedWithTheirIndex) {
  struct Bad {
    DType dtype;
    std::uint16_t bits;
    const char* what;
  };
  const Bad cases[] = {{DType::kBF16, 0x7fc0, "NaN"},         {DType::kBF16, 0x7f80, "an infinity"},
                       {DType::kBF16, 0xff80, "an infinity"}, {DType::kBF16, 0xff81, "NaN"},
                       {DType::kF16, 0x7e00, "NaN"},          {DType::kF16, 0x7c00, "an infinity"},
                       {DType::kF16, 0xfc00, "an infinity"},  {DType::kF16, 0x7c01, "NaN"}};
  for (const Bad& bad : cases) {
    SCOPED_TRACE(std::string(dtype_name(bad.dtype)) + " " + std::to_string(bad.bits));
    Tensor t = testing::random_tensor(bad.dtype, {3, 5, 7}, 1);
    const TensorView clean{t.data(), bad.dtype, t.shape(), contiguous_strides(t.shape()), "x.npy"};
    EXPECT_EQ(message_of(clean), "");
    t.data_as<std::uint16_t>()[52] = bad.bits;
    EXPECT_EQ(message_of(clean),
              std::string("holds ") + bad.what + " at [1, 2, 3] (inputs must be finite)");
    // A column block (the row-by-row scan) and a transposed view (the element walk): the index
    // is the view's own NumPy index of element 52 = [1, 2, 3] of t: [1, 2, 2] and [3, 2, 1].
    const TensorView block{
        t.data_as<std::uint16_t>() + 1, bad.dtype, {3, 5, 5}, {35, 7, 1}, "block"};
    EXPECT_EQ(message_of(block),
              std::string("holds ") + bad.what + " at [1, 2, 2] (inputs must be finite)");
    const TensorView transposed{t.data(), bad.dtype, {7, 5, 3}, {1, 7, 35}, "t"};
    EXPECT_EQ(message_of(transposed),
              std::string("holds ") + bad.what + " at [3, 2, 1] (inputs must be finite)");
  }
}

TEST(Validate, IndexStringIsTheNumpyIndexOfAFlatPosition) {
  EXPECT_EQ(core::index_string({5, 8}, 0), "[0, 0]");
  EXPECT_EQ(core::index_string({5, 8}, 19), "[2, 3]");
  EXPECT_EQ(core::index_string({2, 3, 4, 5}, 119), "[1, 2, 3, 4]");
  EXPECT_EQ(core::index_string({2, 3, 4, 5}, 1 * 60 + 0 * 20 + 2 * 5 + 1), "[1, 0, 2, 1]");
  EXPECT_EQ(core::index_string({7}, 6), "[6]");
  EXPECT_EQ(core::index_string({}, 0), "[]");
}

TEST(ValidateSixteenBit, MagnitudeBounds) {
  // float16: its largest finite value bounds a view that passes the scan.
  Tensor h = testing::random_tensor(DType::kF16, {4, 64}, 2);
  h.data_as<std::uint16_t>()[9] = 0xfbff;  // -65504
  const TensorView hv = h.view();
  EXPECT_EQ(core::require_finite({&hv}, 1), std::vector<double>{65504.0});
  // bfloat16 below 2^32: the float32 path's bound; at or above it, the exact largest magnitude.
  Tensor b = testing::random_tensor(DType::kBF16, {4, 64}, 3);
  const TensorView bv = b.view();
  EXPECT_EQ(core::require_finite({&bv}, 1), std::vector<double>{4294967296.0});
  b.data_as<std::uint16_t>()[200] = core::float_to_bf16(-3.0e38f);
  const double big = static_cast<double>(core::bf16_to_float(core::float_to_bf16(3.0e38f)));
  for (const int threads : {1, 3}) {
    EXPECT_EQ(core::require_finite({&hv, &bv}, threads), (std::vector<double>{65504.0, big}));
  }
  b.data_as<std::uint16_t>()[200] = 0x7f7f;  // bfloat16's largest finite value
  EXPECT_EQ(core::require_finite({&bv}, 1)[0], static_cast<double>(core::bf16_to_float(0x7f7f)));
}

TEST(Validate, ScansInMemoryOrderAndNamesInCOrder) {
  // transformers' heads: [B, H, N, D] views of a contiguous [B, N, H, D] (B 2, N 4, H 3, D 8),
  // a view broadcast over a stride-0 dimension, and a fully transposed one: each is scanned in
  // memory order (a clean view gets the scan's 2^32 bound, not a walk's exact maximum, for any
  // thread count), and a bad element is still named by the view's own C-order index.
  Tensor t = testing::random_tensor(DType::kF32, {2, 4, 3, 8}, 4);
  const TensorView heads{t.data(), DType::kF32, {2, 3, 4, 8}, {96, 8, 24, 1}, "q"};
  const TensorView repeated{t.data(), DType::kF32, {2, 5, 96}, {96, 0, 1}, "k"};
  const TensorView transposed{t.data(), DType::kF32, {8, 3, 4, 2}, {1, 8, 24, 96}, "v"};
  for (const int threads : {1, 3}) {
    EXPECT_EQ(core::require_finite({&heads, &repeated, &transposed}, threads),
              (std::vector<double>(3, 4294967296.0)));
  }
  // Element [1, 2, 3, 5] of `heads` is stored at 96 + 2·8 + 3·24 + 5 = 189.
  t.data_as<float>()[189] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(message_of(heads), "holds NaN at [1, 2, 3, 5] (inputs must be finite)");
  EXPECT_EQ(message_of(repeated), "holds NaN at [1, 0, 93] (inputs must be finite)");
  EXPECT_EQ(message_of(transposed), "holds NaN at [5, 2, 3, 1] (inputs must be finite)");
}

TEST(Validate, ALongContiguousRunIsSharedBetweenThreads) {
  // A transposed [3, 2^18]: one run of 3 · 2^18 floats in memory order, cut into rows of 6144
  // that up to 3 threads share (2^18 elements each at least); the infinity stored last is found
  // by whichever thread reads it and named in the view's index.
  constexpr std::int64_t kLength = std::int64_t{1} << 18;
  Tensor t = testing::random_tensor(DType::kF32, {3, kLength}, 5);
  const TensorView columns{t.data(), DType::kF32, {kLength, 3}, {1, kLength}, "x"};
  t.data_as<float>()[3 * kLength - 1] = std::numeric_limits<float>::infinity();
  for (const int threads : {1, 2, 4}) {
    try {
      core::require_finite({&columns}, threads);
      ADD_FAILURE() << "the infinity was not found with " << threads << " threads";
    } catch (const Error& e) {
      EXPECT_EQ(e.problem(), "holds an infinity at [262143, 2] (inputs must be finite)");
    }
  }
}

}  // namespace
}  // namespace qkv
