#include "qkv/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

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

}  // namespace
}  // namespace qkv
