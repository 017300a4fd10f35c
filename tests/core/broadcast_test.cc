#include "core/broadcast.h"

#include <gtest/gtest.h>

#include "qkv/error.h"

namespace qkv::core {
namespace {

TensorView view(Shape shape) {
  return TensorView{nullptr, DType::kBool, shape, contiguous_strides(shape), "mask.npy"};
}

TEST(Broadcast, AlignsFromTheRightWithZeroStrides) {
  // [B,1,1,Nk] key padding against [2,4,7,12].
  EXPECT_EQ(broadcast_strides(view({2, 1, 1, 12}), {2, 4, 7, 12}, "scores"),
            (Shape{12, 0, 0, 1}));
  // A 1-D mask over keys.
  EXPECT_EQ(broadcast_strides(view({12}), {2, 4, 7, 12}, "scores"), (Shape{0, 0, 0, 1}));
  // [Nq, Nk] shared by all batches and heads.
  EXPECT_EQ(broadcast_strides(view({7, 12}), {2, 4, 7, 12}, "scores"), (Shape{0, 0, 12, 1}));
  // Full shape: its own strides.
  EXPECT_EQ(broadcast_strides(view({2, 4, 7, 12}), {2, 4, 7, 12}, "scores"),
            (Shape{336, 84, 12, 1}));
  // A scalar broadcasts everywhere.
  EXPECT_EQ(broadcast_strides(view({}), {7, 12}, "scores"), (Shape{0, 0}));
}

TEST(Broadcast, RejectsMismatchesNamingTheView) {
  for (const Shape& bad : {Shape{11}, Shape{3, 12}, Shape{7, 2}}) {
    try {
      broadcast_strides(view(bad), {7, 12}, "the score shape [7, 12]");
      FAIL() << shape_string(bad);
    } catch (const Error& e) {
      EXPECT_EQ(e.subject(), "mask.npy");
      EXPECT_NE(e.problem().find("does not broadcast to the score shape [7, 12]"),
                std::string::npos)
          << e.what();
    }
  }
}

// NumPy's np.broadcast_to refuses a view with more dims than the target, even leading ones:
// [1, 2, 3, 4, 5] against scores [2, 3, 4, 5] is an error, and the message says why.
TEST(Broadcast, RejectsMoreDimsThanTheTargetAsNumPyDoes) {
  for (const Shape& bad : {Shape{1, 2, 3, 4, 5}, Shape{1, 1, 7, 12}, Shape{1, 7, 12},
                           Shape{3, 1, 1, 12}, Shape{2, 1, 7, 12}}) {
    try {
      broadcast_strides(view(bad), bad.size() == 5 ? Shape{2, 3, 4, 5} : Shape{7, 12},
                        "the score shape");
      FAIL() << shape_string(bad);
    } catch (const Error& e) {
      EXPECT_EQ(e.subject(), "mask.npy");
      EXPECT_NE(e.problem().find("more than the"), std::string::npos) << e.what();
      EXPECT_NE(e.problem().find("NumPy"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace qkv::core
