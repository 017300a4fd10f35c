// The public attention API: validation names its subject; views, dtypes and outputs behave.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv {
namespace {

Tensor named(Tensor t, const char* name) {
  Tensor copy(t.dtype(), t.shape(), name);
  std::memcpy(copy.data(), t.data(), t.nbytes());
  return copy;
}

Tensor rnd(Shape shape, std::uint64_t seed, const char* name, DType dtype = DType::kF32) {
  return named(testing::random_tensor(dtype, shape, seed), name);
}

// Runs attention expecting a qkv::Error whose subject is `subject` and whose problem contains
// `fragment`.
void expect_error(const TensorView& q, const TensorView& k, const TensorView& v,
                  const AttentionOptions& o, const std::string& subject,
                  const std::string& fragment) {
  try {
    attention(q, k, v, o);
    ADD_FAILURE() << "expected an error about " << subject;
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), subject) << e.what();
    EXPECT_NE(e.problem().find(fragment), std::string::npos) << e.what();
  }
}

TEST(AttentionApi, ShapeMismatchesNameTheOffendingTensor) {
  const Tensor q = rnd({2, 4, 5, 8}, 1, "q.npy");
  const Tensor k = rnd({2, 4, 6, 8}, 2, "k.npy");
  const Tensor v = rnd({2, 4, 6, 3}, 3, "v.npy");
  const AttentionOptions o;
  expect_error(q.view(), rnd({4, 6, 8}, 4, "k3.npy").view(), v.view(), o, "k3.npy",
               "expected 4 dims like q.npy, got 3");
  expect_error(q.view(), rnd({2, 4, 6, 16}, 5, "k16.npy").view(), v.view(), o, "k16.npy",
               "head dimension 16 differs from q.npy's 8");
  expect_error(q.view(), k.view(), rnd({2, 4, 7, 3}, 6, "v7.npy").view(), o, "v7.npy",
               "has 7 rows but k.npy has 6");
  expect_error(q.view(), rnd({3, 4, 6, 8}, 7, "kb.npy").view(), v.view(), o, "kb.npy",
               "batch size 3 differs");
  expect_error(rnd({6, 5, 8}, 8, "q6.npy").view(), rnd({4, 6, 8}, 9, "k4.npy").view(),
               rnd({4, 6, 3}, 10, "v4.npy").view(), o, "k4.npy", "do not divide");
  expect_error(q.view(), k.view(), rnd({2, 2, 6, 3}, 11, "v2.npy").view(), o, "v2.npy",
               "has 2 heads but k.npy has 4");
  expect_error(rnd({8}, 12, "q1.npy").view(), k.view(), v.view(), o, "q1.npy",
               "expected 2, 3 or 4 dims");
}

TEST(AttentionApi, NonFiniteInputsAndBadOptionsAreRejected) {
  Tensor q = rnd({5, 8}, 1, "q.npy");
  const Tensor k = rnd({6, 8}, 2, "k.npy");
  const Tensor v = rnd({6, 3}, 3, "v.npy");
  q.data_as<float>()[7] = std::numeric_limits<float>::quiet_NaN();
  expect_error(q.view(), k.view(), v.view(), {}, "q.npy", "NaN at [0, 7]");
  q.data_as<float>()[7] = -std::numeric_limits<float>::infinity();
  expect_error(q.view(), k.view(), v.view(), {}, "q.npy", "an infinity");
  q.data_as<float>()[7] = 0;

  Tensor mask = rnd({6}, 4, "mask.npy");
  mask.data_as<float>()[2] = std::numeric_limits<float>::infinity();
  AttentionOptions o;
  o.mask = mask.view();
  expect_error(q.view(), k.view(), v.view(), o, "mask.npy", "+inf");
  mask.data_as<float>()[2] = std::numeric_limits<float>::quiet_NaN();
  expect_error(q.view(), k.view(), v.view(), o, "mask.npy", "NaN");
  const Tensor wrong = rnd({7}, 5, "wrong.npy");
  o.mask = wrong.view();
  expect_error(q.view(), k.view(), v.view(), o, "wrong.npy", "does not broadcast");

  AttentionOptions bad_window;
  bad_window.window = Window{-2, 0};
  expect_error(q.view(), k.view(), v.view(), bad_window, "window", ">= 0");
  AttentionOptions bad_scale;
  bad_scale.scale = std::numeric_limits<double>::infinity();
  expect_error(q.view(), k.view(), v.view(), bad_scale, "scale", "finite");
  AttentionOptions bad_kernel;
  bad_kernel.kernel = "no-such";
  expect_error(q.view(), k.view(), v.view(), bad_kernel, "kernel no-such", "reference");
}

TEST(AttentionApi, NonFiniteValuesAreFoundInColumnBlocksAndOnlyThere) {
  // Heads 0 and 2 of a [N, 3·d] matrix as a strided view [2, N, d] (column blocks 0 and 2):
  // a non-finite value in block 1 lies outside the view and must not be reported; one inside
  // is named with the view's own NumPy index, in every dtype alike.
  for (const DType dtype : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor wide = rnd({5, 3 * 8}, 1, "wide", dtype);
    const TensorView q{wide.data(), dtype, {2, 5, 8}, {16, 24, 1}, "q.npy"};
    const Tensor k = rnd({2, 6, 8}, 2, "k.npy");
    const Tensor v = rnd({2, 6, 3}, 3, "v.npy");
    const auto set = [&](std::int64_t element, double value) {
      Tensor one(DType::kF64, {1}, "one");
      one.data_as<double>()[0] = value;
      const Tensor x = one.to(dtype);
      std::memcpy(
          static_cast<char*>(wide.data()) + static_cast<std::size_t>(element) * dtype_size(dtype),
          x.data(), dtype_size(dtype));
    };
    set(2 * 24 + 8 + 3, std::numeric_limits<double>::infinity());  // row 2, block 1
    EXPECT_NO_THROW(attention(q, k.view(), v.view()));
    // View [1, 3, 5] is row 3, column 16 + 5 of the wide matrix.
    set(3 * 24 + 16 + 5, std::numeric_limits<double>::quiet_NaN());
    expect_error(q, k.view(), v.view(), {}, "q.npy", "NaN at [1, 3, 5]");
  }
}

// Q, K and V may be stored in 16 bits (any mix with float32 and float64); masks may not, and
// other dtypes are named.
TEST(AttentionApi, SixteenBitInputsAreAcceptedAndMasksStayWide) {
  const Tensor q = rnd({2, 5, 8}, 1, "q.npy", DType::kF16);
  const Tensor k = rnd({2, 6, 8}, 2, "k.npy", DType::kBF16);
  const Tensor v = rnd({2, 6, 3}, 3, "v.npy", DType::kF16);
  AttentionOptions o;
  o.return_lse = true;
  const AttentionResult r = attention(q.view(), k.view(), v.view(), o);
  EXPECT_EQ(r.out.dtype(), DType::kF32);
  EXPECT_EQ(r.out.shape(), (Shape{2, 5, 3}));
  // The same call on the values widened to float64 gives the same reference result.
  AttentionOptions ref = o;
  ref.kernel = "reference";
  ref.out_dtype = DType::kF64;
  const AttentionResult a = attention(q.view(), k.view(), v.view(), ref);
  const AttentionResult b =
      attention(q.to(DType::kF64).view(), k.to(DType::kF64).view(), v.to(DType::kF64).view(), ref);
  EXPECT_EQ(testing::max_abs_diff(a.out.view(), b.out.view()), 0.0);
  EXPECT_EQ(testing::max_abs_diff(a.lse.view(), b.lse.view()), 0.0);

  const Tensor mask = rnd({6}, 4, "mask.npy", DType::kF16);
  o.mask = mask.view();
  expect_error(q.view(), k.view(), v.view(), o, "mask.npy",
               "dtype float16 is not supported (expected float32 or float64)");
  const Tensor flags = rnd({2, 6, 3}, 5, "flags.npy", DType::kBool);
  expect_error(q.view(), k.view(), flags.view(), {}, "flags.npy",
               "dtype bool is not supported (expected float32, float64, bfloat16 or float16)");
}

TEST(AttentionApi, TheThreadedScanNamesTheSameFirstBadValueForAnyThreadCount) {
  // Q, K and V large enough that the finiteness scan splits their rows between up to three
  // threads (with two, the split falls inside K, at its head 1, row 350), as column blocks of
  // [N, 131] matrices whose last three columns are NaN: the scan must read exactly the view's
  // rows, and the first bad view in the order Q, K, V is named with its own index,
  // whatever the thread count.
  constexpr std::int64_t kHeads = 3, kRows = 700, kCols = 128, kStride = 131;
  const auto wide = [&](std::uint64_t seed) {
    Tensor t = rnd({kHeads * kRows, kStride}, seed, "wide");
    for (std::int64_t r = 0; r < kHeads * kRows; ++r) {
      for (std::int64_t c = kCols; c < kStride; ++c) {
        t.data_as<float>()[r * kStride + c] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    return t;
  };
  Tensor wq = wide(1), wk = wide(2), wv = wide(3);
  const Shape shape{kHeads, kRows, kCols};
  const Shape strides{kRows * kStride, kStride, 1};
  const TensorView q{wq.data(), DType::kF32, shape, strides, "q.npy"};
  const TensorView k{wk.data(), DType::kF32, shape, strides, "k.npy"};
  const TensorView v{wv.data(), DType::kF32, shape, strides, "v.npy"};
  for (const int threads : {1, 3}) {
    AttentionOptions o;
    o.threads = threads;
    EXPECT_NO_THROW(attention(q, k, v, o)) << threads << " threads";
  }
  // K's element [2, 350, 5], and a later one in V: K is named, at its own index.
  wk.data_as<float>()[(2 * kRows + 350) * kStride + 5] = std::numeric_limits<float>::infinity();
  wv.data_as<float>()[(1 * kRows + 10) * kStride + 7] = std::numeric_limits<float>::quiet_NaN();
  for (const int threads : {1, 2, 3, 8}) {
    AttentionOptions o;
    o.threads = threads;
    expect_error(q, k, v, o, "k.npy", "an infinity at [2, 350, 5]");
  }
  // V alone: its value in the first chunk is found too.
  wk.data_as<float>()[(2 * kRows + 350) * kStride + 5] = 0.0f;
  for (const int threads : {1, 2, 3, 8}) {
    AttentionOptions o;
    o.threads = threads;
    expect_error(q, k, v, o, "v.npy", "NaN at [1, 10, 7]");
  }
}

TEST(AttentionApi, StridedColumnBlocksEqualContiguousCopies) {
  // Q and K as head column blocks of [N, H·d] matrices in float64, V contiguous float32.
  const Tensor wide_q = rnd({5, 3 * 8}, 1, "wq", DType::kF64);
  const Tensor wide_k = rnd({7, 3 * 8}, 2, "wk", DType::kF64);
  const Tensor v = rnd({3, 7, 4}, 3, "v");
  const TensorView q{wide_q.data(), DType::kF64, {3, 5, 8}, {8, 24, 1}, "q"};
  const TensorView k{wide_k.data(), DType::kF64, {3, 7, 8}, {8, 24, 1}, "k"};
  AttentionOptions o;
  o.out_dtype = DType::kF64;
  o.causal = true;
  const AttentionResult strided = attention(q, k, v.view(), o);
  const Tensor q_copy = contiguous_copy(q, DType::kF64);
  const Tensor k_copy = contiguous_copy(k, DType::kF64);
  const AttentionResult dense = attention(q_copy.view(), k_copy.view(), v.view(), o);
  EXPECT_EQ(testing::max_abs_diff(strided.out.view(), dense.out.view()), 0.0);
}

TEST(AttentionApi, OutputDtypeAndExtraOutputs) {
  const Tensor q = rnd({2, 5, 8}, 1, "q");
  const Tensor k = rnd({2, 6, 8}, 2, "k");
  const Tensor v = rnd({2, 6, 3}, 3, "v");
  AttentionOptions o;
  const AttentionResult plain = attention(q.view(), k.view(), v.view(), o);
  EXPECT_EQ(plain.out.dtype(), DType::kF32);
  EXPECT_TRUE(plain.weights.empty());
  EXPECT_TRUE(plain.lse.empty());
  o.out_dtype = DType::kF64;
  o.return_weights = o.return_lse = true;
  const AttentionResult full = attention(q.view(), k.view(), v.view(), o);
  EXPECT_EQ(full.out.dtype(), DType::kF64);
  EXPECT_EQ(full.weights.shape(), (Shape{2, 5, 6}));
  EXPECT_EQ(full.lse.shape(), (Shape{2, 5}));
  EXPECT_LT(testing::max_abs_diff(plain.out.view(), full.out.view()), 1e-6);
  // Rows of weights sum to one: to float64 accuracy from the reference, and to float32
  // accuracy (a few ulps of 1 per key) from the default kernel, which computes in float32.
  o.kernel = "reference";
  const AttentionResult exact = attention(q.view(), k.view(), v.view(), o);
  for (std::int64_t row = 0; row < 10; ++row) {
    double sum = 0, sum_exact = 0;
    for (std::int64_t j = 0; j < 6; ++j) {
      sum += full.weights.data_as<double>()[row * 6 + j];
      sum_exact += exact.weights.data_as<double>()[row * 6 + j];
    }
    EXPECT_NEAR(sum, 1.0, 6 * 2 * 6e-8);
    EXPECT_NEAR(sum_exact, 1.0, 1e-15);
  }
}

TEST(AttentionApi, AttentionIntoWritesColumnBlocksAndChecksShapes) {
  const Tensor q = rnd({2, 5, 8}, 1, "q");
  const Tensor k = rnd({2, 6, 8}, 2, "k");
  const Tensor v = rnd({2, 6, 3}, 3, "v");
  const AttentionResult expected = attention(q.view(), k.view(), v.view());
  // Heads side by side: [5, 2·3], head h = columns [3h, 3h+3).
  Tensor concat(DType::kF32, {5, 6}, "concat");
  AttentionOutputs outputs;
  outputs.out = MutableTensorView{concat.data(), DType::kF32, {2, 5, 3}, {3, 6, 1}, "concat"};
  attention_into(q.view(), k.view(), v.view(), {}, outputs);
  const TensorView as_heads{concat.data(), DType::kF32, {2, 5, 3}, {3, 6, 1}, "concat"};
  EXPECT_EQ(testing::max_abs_diff(as_heads, expected.out.view()), 0.0);

  outputs.out.shape = {2, 5, 4};
  EXPECT_THROW(attention_into(q.view(), k.view(), v.view(), {}, outputs), Error);
}

TEST(AttentionApi, KernelListEndsWithTheReference) {
  const auto names = attention_kernel_names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.back(), "reference");
}

}  // namespace
}  // namespace qkv
