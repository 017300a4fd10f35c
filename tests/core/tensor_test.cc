#include "qkv/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/half.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv {
namespace {

TEST(Tensor, IsZeroedContiguousAndAligned) {
  Tensor t(DType::kF32, {2, 3, 4}, "t");
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 64, 0u);
  for (std::int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data_as<float>()[i], 0.0f);
  const TensorView v = t.view();
  EXPECT_EQ(v.strides, (Shape{12, 4, 1}));
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.name, "t");
}

TEST(Tensor, EmptyShapesAreValid) {
  Tensor t(DType::kF64, {0, 5}, "empty");
  EXPECT_EQ(t.numel(), 0);
  EXPECT_NE(t.data(), nullptr);
  Tensor scalar(DType::kF64, {}, "scalar");
  EXPECT_EQ(scalar.numel(), 1);
}

TEST(Tensor, OverflowingShapeThrowsNamingTheTensor) {
  const std::int64_t big = std::int64_t{1} << 40;
  try {
    Tensor t(DType::kF32, {big, big}, "huge.npy");
    FAIL() << "expected qkv::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), "huge.npy");
    EXPECT_NE(e.problem().find("too many elements"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tensor(DType::kF32, {-1}, "neg"), Error);
}

TEST(Tensor, ContiguousCopyFollowsStridesAndConverts) {
  // A 3x2 column block (columns 1..2) of a 3x4 float64 matrix, copied to float32.
  double data[12];
  for (int i = 0; i < 12; ++i) data[i] = i;
  const TensorView block{data + 1, DType::kF64, {3, 2}, {4, 1}, "block"};
  EXPECT_FALSE(block.is_contiguous());
  const Tensor copy = contiguous_copy(block, DType::kF32);
  const float expected[6] = {1, 2, 5, 6, 9, 10};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(copy.data_as<float>()[i], expected[i]);
  // A transposed view.
  const TensorView transposed{data, DType::kF64, {4, 3}, {1, 4}, "t"};
  const Tensor t = contiguous_copy(transposed, DType::kF64);
  EXPECT_EQ(t.data_as<double>()[1], 4.0);
  EXPECT_EQ(t.data_as<double>()[3], 1.0);
}

// Every 16-bit pattern but the NaNs widens to float and narrows back to itself, through float32
// and through float64; NaNs stay NaN.
TEST(Tensor, SixteenBitStorageRoundTripsThroughFloat32AndFloat64) {
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor all(dtype, {65536}, "all");
    for (std::uint32_t i = 0; i < 65536; ++i) {
      all.data_as<std::uint16_t>()[i] = static_cast<std::uint16_t>(i);
    }
    const std::uint16_t exponent = dtype == DType::kBF16 ? 0x7f80 : 0x7c00;
    const std::uint16_t fraction = dtype == DType::kBF16 ? 0x007f : 0x03ff;
    for (const DType wide : {DType::kF32, DType::kF64}) {
      const Tensor widened = all.to(wide);
      EXPECT_EQ(widened.dtype(), wide);
      const Tensor back = widened.to(dtype);
      EXPECT_EQ(back.dtype(), dtype);
      EXPECT_EQ(back.nbytes(), 65536u * 2);
      for (std::uint32_t i = 0; i < 65536; ++i) {
        const auto bits = static_cast<std::uint16_t>(i);
        const bool nan = (bits & exponent) == exponent && (bits & fraction) != 0;
        const double x = testing::element(widened.view(), i);
        if (nan) {
          EXPECT_TRUE(std::isnan(x)) << i;
          const std::uint16_t got = back.data_as<std::uint16_t>()[i];
          EXPECT_TRUE((got & exponent) == exponent && (got & fraction) != 0) << i;
        } else {
          ASSERT_EQ(back.data_as<std::uint16_t>()[i], bits) << dtype_name(wide) << " " << i;
        }
      }
    }
  }
}

// Narrowing rounds to nearest even once: float64 -> 16 bits must not round to float32 first,
// which turns a value just above a tie into the tie and then rounds it to even, down.
TEST(Tensor, NarrowingFromFloat64RoundsOnce) {
  Tensor x(DType::kF64, {8}, "x");
  double* v = x.data_as<double>();
  v[0] = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);   // just above a bfloat16 tie
  v[1] = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);  // just above a float16 tie
  v[2] = 1.0 + std::ldexp(1.0, -8);                          // a bfloat16 tie: to even, down
  v[3] = 1.0e300;                                            // beyond every 16-bit range
  v[4] = 65519.0;                                            // float16: rounds to 65504
  v[5] = 65520.0;                                            // float16: the tie, to infinity
  v[6] = -1.0e-300;                                          // below every subnormal: -0
  v[7] = std::ldexp(1.0, -25) + std::ldexp(1.0, -60);  // float16: above half its least subnormal
  const Tensor bf = x.to(DType::kBF16);
  const Tensor h = x.to(DType::kF16);
  const std::uint16_t* b16 = bf.data_as<std::uint16_t>();
  const std::uint16_t* f16 = h.data_as<std::uint16_t>();
  EXPECT_EQ(b16[0], 0x3f81);
  EXPECT_EQ(b16[2], 0x3f80);
  EXPECT_EQ(b16[3], 0x7f80);
  EXPECT_EQ(b16[6], 0x8000);
  EXPECT_EQ(f16[1], 0x3c01);
  EXPECT_EQ(f16[3], 0x7c00);
  EXPECT_EQ(f16[4], 0x7bff);
  EXPECT_EQ(f16[5], 0x7c00);
  EXPECT_EQ(f16[6], 0x8000);
  EXPECT_EQ(f16[7], 0x0001);
  // From float32 the result is half.h's conversion of the same value.
  const Tensor f = x.to(DType::kF32);
  for (std::int64_t i = 0; i < 8; ++i) {
    const float fv = f.data_as<float>()[i];
    EXPECT_EQ(f.to(DType::kBF16).data_as<std::uint16_t>()[i], core::float_to_bf16(fv)) << i;
    EXPECT_EQ(f.to(DType::kF16).data_as<std::uint16_t>()[i], core::float_to_f16(fv)) << i;
  }
}

TEST(Tensor, ContiguousCopyReadsStridedSixteenBitViews) {
  // Columns 1..2 of a 3x4 float16 matrix holding 0..11 (exact in float16).
  Tensor m(DType::kF16, {3, 4}, "m");
  for (int i = 0; i < 12; ++i) {
    m.data_as<std::uint16_t>()[i] = core::float_to_f16(static_cast<float>(i));
  }
  const TensorView block{m.data_as<std::uint16_t>() + 1, DType::kF16, {3, 2}, {4, 1}, "block"};
  const Tensor copy = contiguous_copy(block, DType::kF32);
  const float expected[6] = {1, 2, 5, 6, 9, 10};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(copy.data_as<float>()[i], expected[i]);
  const Tensor same = contiguous_copy(block, DType::kF16);
  EXPECT_EQ(same.dtype(), DType::kF16);
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(core::f16_to_float(same.data_as<std::uint16_t>()[i]), expected[i]);
  const Tensor bf = contiguous_copy(block, DType::kBF16);
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(core::bf16_to_float(bf.data_as<std::uint16_t>()[i]), expected[i]);
}

TEST(Tensor, ReshapeKeepsElementsAndRejectsOtherSizes) {
  Tensor t = testing::random_tensor(DType::kF32, {2, 6}, 1);
  const float first = t.data_as<float>()[7];
  t.reshape({3, 4});
  EXPECT_EQ(t.shape(), (Shape{3, 4}));
  EXPECT_EQ(t.data_as<float>()[7], first);
  EXPECT_THROW(t.reshape({5}), Error);
}

TEST(Tensor, ShapeString) {
  EXPECT_EQ(shape_string({2, 4, 33}), "[2, 4, 33]");
  EXPECT_EQ(shape_string({}), "[]");
}

// Converting to an index type goes toward zero and saturates; NaN becomes 0 (a plain cast of
// NaN or of an out-of-range value is undefined behaviour, which UBSan reports).
TEST(Tensor, ToIntegersSaturatesAndTakesNaNAsZero) {
  Tensor t(DType::kF64, {6});
  const double values[] = {std::nan(""), 1e20, -1e20, 2.7, -2.7, 1e300};
  for (int i = 0; i < 6; ++i) t.data_as<double>()[i] = values[i];
  const Tensor i32 = t.to(DType::kI32);
  const std::int32_t want32[] = {0, 2147483647, -2147483647 - 1, 2, -2, 2147483647};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(i32.data_as<std::int32_t>()[i], want32[i]) << i;
  const Tensor i64 = t.to(DType::kI64);
  EXPECT_EQ(i64.data_as<std::int64_t>()[0], 0);
  EXPECT_EQ(i64.data_as<std::int64_t>()[1], std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(i64.data_as<std::int64_t>()[2], std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(i64.data_as<std::int64_t>()[3], 2);
  EXPECT_EQ(i64.to(DType::kF64).data_as<double>()[4], -2.0);
}

}  // namespace
}  // namespace qkv
