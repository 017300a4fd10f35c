// attention_into refuses outputs that share memory with an input or with each other (issue
// 22, item 1: `out` pointing into V returned OK with a result off by 0.02), in one line naming
// both tensors, before writing anything; outputs that only sit beside inputs in one wider
// matrix (column blocks, other rows) are accepted and computed exactly as with separate memory.
#include "core/overlap.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv {
namespace {

// A [rows, cols] view at column `col0` of a [rows, width] float32 matrix.
TensorView block(Tensor& m, std::int64_t col0, std::int64_t rows, std::int64_t cols,
                 const std::string& name) {
  const std::int64_t width = m.shape()[1];
  return TensorView{m.data_as<float>() + col0, DType::kF32, {rows, cols}, {width, 1}, name};
}
MutableTensorView mutable_block(Tensor& m, std::int64_t col0, std::int64_t rows, std::int64_t cols,
                                const std::string& name) {
  const std::int64_t width = m.shape()[1];
  return MutableTensorView{m.data_as<float>() + col0, DType::kF32, {rows, cols}, {width, 1}, name};
}

std::string refusal(const TensorView& q, const TensorView& k, const TensorView& v,
                    const AttentionOutputs& outputs) {
  try {
    attention_into(q, k, v, AttentionOptions{}, outputs);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(OutputOverlap, AnOutputInsideAnInputIsRefusedNamingBoth) {
  Tensor q = testing::random_tensor(DType::kF32, {6, 4}, 1);
  Tensor k = testing::random_tensor(DType::kF32, {6, 4}, 2);
  Tensor v = testing::random_tensor(DType::kF32, {6, 4}, 3);
  const Tensor v_before = v.to(DType::kF32);
  TensorView qv = q.view(), kv = k.view(), vv = v.view();
  qv.name = "q", kv.name = "k", vv.name = "v";
  MutableTensorView out = v.mutable_view();  // out is V itself
  out.name = "out";
  const std::string message = refusal(qv, kv, vv, {out, std::nullopt, std::nullopt});
  EXPECT_NE(message.find("out: output memory overlaps the input v"), std::string::npos) << message;
  EXPECT_TRUE(testing::same_bytes(v, v_before));  // nothing written
  // A shifted window into Q, and an lse written into K, are refused too.
  MutableTensorView shifted{q.data_as<float>() + 3, DType::kF32, {6, 4}, {4, 1}, "out"};
  EXPECT_NE(refusal(qv, kv, vv, {shifted, std::nullopt, std::nullopt}).find("input q"),
            std::string::npos);
  Tensor o(DType::kF32, {6, 4});
  MutableTensorView lse{k.data(), DType::kF32, {6}, {1}, "lse"};
  EXPECT_NE(refusal(qv, kv, vv, {o.mutable_view(), std::nullopt, lse})
                .find("lse: output memory "
                      "overlaps the input k"),
            std::string::npos);
}

TEST(OutputOverlap, TwoOutputsSharingMemoryAreRefused) {
  Tensor q = testing::random_tensor(DType::kF32, {6, 4}, 1);
  Tensor o(DType::kF32, {6, 6});
  MutableTensorView out{o.data(), DType::kF32, {6, 4}, {6, 1}, "out"};
  MutableTensorView weights{o.data_as<float>() + 2, DType::kF32, {6, 6}, {6, 1}, "weights"};
  const std::string message = refusal(q.view(), q.view(), q.view(), {out, weights, std::nullopt});
  EXPECT_NE(message.find("overlaps the output weights"), std::string::npos) << message;
}

TEST(OutputOverlap, ColumnBlocksOfOneMatrixAreAcceptedAndExact) {
  // Q, K, V and the output as four column blocks of one [7, 4·5 + 1] matrix.
  Tensor m = testing::random_tensor(DType::kF32, {7, 21}, 4);
  const TensorView q = block(m, 0, 7, 5, "q"), k = block(m, 5, 7, 5, "k"),
                   v = block(m, 10, 7, 5, "v");
  MutableTensorView out = mutable_block(m, 15, 7, 5, "out");
  const Tensor qc = contiguous_copy(q, DType::kF32), kc = contiguous_copy(k, DType::kF32),
               vc = contiguous_copy(v, DType::kF32);
  const AttentionResult expected = attention(qc.view(), kc.view(), vc.view());
  ASSERT_NO_THROW(attention_into(q, k, v, AttentionOptions{}, {out, std::nullopt, std::nullopt}));
  EXPECT_EQ(testing::max_abs_diff(TensorView(out), expected.out.view()), 0.0);
  // The same columns in other rows are disjoint too; the same rows and columns are not.
  EXPECT_FALSE(core::may_overlap(
      block(m, 0, 3, 5, "a"),
      TensorView{m.data_as<float>() + 4 * 21, DType::kF32, {3, 5}, {21, 1}, "b"}));
  EXPECT_TRUE(core::may_overlap(block(m, 0, 7, 5, "a"), block(m, 4, 7, 5, "b")));
  EXPECT_TRUE(core::may_overlap(block(m, 3, 7, 5, "a"), block(m, 0, 7, 5, "b")));
}

}  // namespace
}  // namespace qkv
