// No kernel reads outside its inputs: Q, K, V and the mask placed in memory filled with NaN —
// before, after and between rows — give the same bits as the same values packed contiguously.
// A single read of a NaN neighbour would turn an output NaN (or change its bits).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv {
namespace {

constexpr std::int64_t kGuard = 67;  // NaN elements before and after, and a row gap of 5

// `t` copied into a NaN-filled buffer: `kGuard` NaNs before, rows padded by 5 NaNs, `kGuard`
// after. Returns the view of the copy; `storage` owns the memory.
template <typename T>
TensorView guarded(const Tensor& t, std::vector<T>& storage) {
  const Shape& shape = t.shape();
  const std::int64_t cols = shape.back();
  const std::int64_t rows = t.numel() / std::max<std::int64_t>(cols, 1);
  const std::int64_t row_stride = cols + 5;
  storage.assign(static_cast<std::size_t>(2 * kGuard + rows * row_stride),
                 std::numeric_limits<T>::quiet_NaN());
  T* base = storage.data() + kGuard;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) base[r * row_stride + c] = t.data_as<T>()[r * cols + c];
  }
  TensorView view{base, t.dtype(), shape, contiguous_strides(shape), t.name()};
  // Strides in elements: the last dim 1, the rows `row_stride`, outer dims multiples of it.
  std::int64_t stride = row_stride;
  view.strides.back() = 1;
  for (int axis = static_cast<int>(shape.size()) - 2; axis >= 0; --axis) {
    view.strides[static_cast<std::size_t>(axis)] = stride;
    stride *= shape[static_cast<std::size_t>(axis)];
  }
  return view;
}

// A bool mask in a buffer of 0xff bytes (not a valid bool: a read would be visible to
// sanitizers, and a kernel reading one would see "allowed").
TensorView guarded_bool(const Tensor& t, std::vector<unsigned char>& storage) {
  storage.assign(static_cast<std::size_t>(2 * kGuard + t.numel()), 0);
  std::memcpy(storage.data() + kGuard, t.data(), static_cast<std::size_t>(t.numel()));
  return TensorView{storage.data() + kGuard, DType::kBool, t.shape(), contiguous_strides(t.shape()),
                    t.name()};
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

struct Case {
  Shape q, k, v;
  bool causal;
  int mask;  // 0 none, 1 float, 2 bool
  DType dtype;
};

class NanGuard : public ::testing::TestWithParam<std::string> {};

TEST_P(NanGuard, SurroundingNaNsChangeNoBit) {
  const std::vector<Case> cases = {
      {{1, 1, 1}, {1, 1, 1}, {1, 1, 1}, false, 0, DType::kF32},
      {{2, 17, 9}, {2, 33, 9}, {2, 33, 7}, true, 0, DType::kF32},
      {{2, 4, 70, 16}, {2, 2, 70, 16}, {2, 2, 70, 16}, false, 1, DType::kF32},
      {{3, 65, 33}, {1, 130, 33}, {1, 130, 5}, true, 2, DType::kF32},
      {{2, 8, 4}, {2, 129, 4}, {2, 129, 3}, false, 1, DType::kF64},
  };
  int ran = 0;
  std::uint64_t seed = 1;
  for (const Case& c : cases) {
    const Tensor q = testing::random_tensor(c.dtype, c.q, seed++);
    const Tensor k = testing::random_tensor(c.dtype, c.k, seed++);
    const Tensor v = testing::random_tensor(c.dtype, c.v, seed++);
    Shape mask_shape(c.q.begin(), c.q.end() - 1);
    mask_shape.push_back(c.k[c.k.size() - 2]);
    Tensor mask;
    if (c.mask == 1) {
      mask = testing::random_tensor(c.dtype, mask_shape, seed++, -2.0, 1.0);
      // A few -inf: some keys forbidden.
      for (std::int64_t i = 0; i < mask.numel(); i += 7) {
        if (c.dtype == DType::kF32) {
          mask.data_as<float>()[i] = -std::numeric_limits<float>::infinity();
        } else {
          mask.data_as<double>()[i] = -std::numeric_limits<double>::infinity();
        }
      }
    } else if (c.mask == 2) {
      mask = testing::random_tensor(DType::kBool, mask_shape, seed++);
    }

    AttentionOptions options;
    options.kernel = GetParam();
    options.causal = c.causal;
    options.return_weights = options.return_lse = true;
    options.threads = 3;
    if (c.mask != 0) options.mask = mask.view();

    AttentionResult plain;
    try {
      plain = attention(q.view(), k.view(), v.view(), options);
    } catch (const Error&) {
      continue;  // this kernel declines the case
    }
    std::vector<float> qf, kf, vf, mf;
    std::vector<double> qd, kd, vd, md;
    std::vector<unsigned char> mb;
    const bool f32 = c.dtype == DType::kF32;
    const TensorView gq = f32 ? guarded(q, qf) : guarded(q, qd);
    const TensorView gk = f32 ? guarded(k, kf) : guarded(k, kd);
    const TensorView gv = f32 ? guarded(v, vf) : guarded(v, vd);
    if (c.mask == 1) options.mask = f32 ? guarded(mask, mf) : guarded(mask, md);
    if (c.mask == 2) options.mask = guarded_bool(mask, mb);
    const AttentionResult fenced = attention(gq, gk, gv, options);
    SCOPED_TRACE(shape_string(c.q) + " mask " + std::to_string(c.mask));
    EXPECT_TRUE(same_bits(plain.out, fenced.out));
    EXPECT_TRUE(same_bits(plain.weights, fenced.weights));
    EXPECT_TRUE(same_bits(plain.lse, fenced.lse));
    for (std::int64_t i = 0; i < plain.out.numel(); ++i) {
      ASSERT_FALSE(std::isnan(testing::element(plain.out.view(), i)));
    }
    ++ran;
  }
  EXPECT_GT(ran, 0) << GetParam() << " declined every case";
}

INSTANTIATE_TEST_SUITE_P(EveryKernel, NanGuard, ::testing::ValuesIn(attention_kernel_names()),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace qkv
