// Validation of the version-2 options (validate.cc: storage dtype, softcap, ALiBi, sinks,
// packed-batch offsets): each bad value throws one qkv::Error that names its subject (the
// option, or the tensor by its name) with a one-line problem that says what was expected,
// through attention() and attention_into() alike.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Q [2, 3, 4] (H = 2), K [1, 5, 4], V [1, 5, 2].
struct Inputs {
  Tensor q = testing::random_tensor(DType::kF32, {2, 3, 4}, 1);
  Tensor k = testing::random_tensor(DType::kF32, {1, 5, 4}, 2);
  Tensor v = testing::random_tensor(DType::kF32, {1, 5, 2}, 3);
  TensorView qv() const { return named(q, "Q.npy"); }
  TensorView kv() const { return named(k, "K.npy"); }
  TensorView vv() const { return named(v, "V.npy"); }
  static TensorView named(const Tensor& t, const char* name) {
    TensorView view = t.view();
    view.name = name;
    return view;
  }
};

template <typename T>
Tensor vector_tensor(DType dtype, const Shape& shape, const std::vector<T>& values,
                     const char* name) {
  Tensor t(dtype, shape, name);
  for (std::size_t i = 0; i < values.size(); ++i) t.data_as<T>()[i] = values[i];
  return t;
}

// Runs `call` through attention() and, with the same options, attention_into(); both must
// throw a qkv::Error with this subject whose problem contains `fragment`, on one line.
void expect_refused(const Inputs& in, const AttentionOptions& options, const std::string& subject,
                    const std::string& fragment) {
  const auto check = [&](const std::function<void()>& call, const char* entry) {
    SCOPED_TRACE(entry);
    try {
      call();
      ADD_FAILURE() << "accepted; expected an error about " << subject;
    } catch (const Error& e) {
      EXPECT_EQ(e.subject(), subject) << e.what();
      EXPECT_NE(e.problem().find(fragment), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  };
  check([&] { attention(in.qv(), in.kv(), in.vv(), options); }, "attention");
  Tensor out(DType::kF32, {2, 3, 2}, "O");
  check([&] { attention_into(in.qv(), in.kv(), in.vv(), options, {out.mutable_view(), {}, {}}); },
        "attention_into");
}

TEST(ValidateOptions, SoftcapMustBeFiniteAndPositive) {
  const Inputs in;
  for (const double cap : {0.0, -0.0, -1.0, kNaN, kInf, -kInf}) {
    SCOPED_TRACE(cap);
    AttentionOptions o;
    o.softcap = cap;
    expect_refused(in, o, "softcap", "must be a finite number > 0, got ");
  }
  AttentionOptions o;
  o.softcap = -2.5;
  expect_refused(in, o, "softcap", "got -2.5");
  o.softcap = 1e-300;  // tiny but positive: accepted
  EXPECT_NO_THROW(attention(in.qv(), in.kv(), in.vv(), o));
}

TEST(ValidateOptions, DtypeMustBeARealStorageType) {
  const Inputs in;
  for (const DType d : {DType::kBool, DType::kI32, DType::kI64}) {
    AttentionOptions o;
    o.dtype = d;
    expect_refused(in, o, "dtype", std::string("must be f64, f32, bf16 or f16, got ") + dtype_name(d));
  }
}

TEST(ValidateOptions, StandardAndGivenAlibiSlopesAreExclusive) {
  const Inputs in;
  const Tensor s = vector_tensor<float>(DType::kF32, {2}, {0.5f, 0.25f}, "S.npy");
  AttentionOptions o;
  o.alibi = true;
  o.alibi_slopes = s.view();
  expect_refused(in, o, "alibi", "not both");
}

// Slopes and sinks share the per-head checks; each is run through both options.
void expect_per_head_refusals(const std::string& what,
                              void (*set)(AttentionOptions&, const TensorView&)) {
  const Inputs in;
  SCOPED_TRACE(what);
  const auto refused = [&](const Tensor& t, const std::string& fragment) {
    AttentionOptions o;
    set(o, t.view());
    expect_refused(in, o, t.name(), what + fragment);
  };
  refused(vector_tensor<float>(DType::kF32, {3}, {1, 2, 3}, "S3.npy"),
          " must have shape [2] (one per query head), got ");
  refused(vector_tensor<float>(DType::kF32, {1, 2}, {1, 2}, "S12.npy"), " must have shape [2]");
  refused(Tensor(DType::kF32, {}, "S0.npy"), " must have shape [2]");
  refused(vector_tensor<bool>(DType::kBool, {2}, {true, false}, "Sb.npy"), " must be float, got bool");
  refused(vector_tensor<std::int32_t>(DType::kI32, {2}, {1, 2}, "Si.npy"),
          " must be float, got int32");
  refused(vector_tensor<double>(DType::kF64, {2}, {0.5, kNaN}, "Snan.npy"), " hold NaN at [1]");
  refused(vector_tensor<float>(DType::kF32, {2}, {std::numeric_limits<float>::infinity(), 1.0f},
                               "Sinf.npy"),
          " hold an infinity at [0]");
  refused(vector_tensor<double>(DType::kF64, {2}, {0.5, -kInf}, "Sminf.npy"),
          " hold an infinity at [1]");
  // A strided view is read through its strides: the NaN at element 1 is found.
  Tensor wide = vector_tensor<double>(DType::kF64, {4}, {0.5, 1.0, kNaN, 2.0}, "Sw.npy");
  TensorView strided = wide.view();
  strided.shape = {2};
  strided.strides = {2};
  AttentionOptions o;
  set(o, strided);
  expect_refused(in, o, "Sw.npy", what + " hold NaN at [1]");
  // bfloat16 and float16 values are accepted.
  for (const DType d : {DType::kBF16, DType::kF16}) {
    const Tensor ok = vector_tensor<double>(DType::kF64, {2}, {0.5, 0.25}, "ok").to(d);
    AttentionOptions fine;
    set(fine, ok.view());
    EXPECT_NO_THROW(attention(in.qv(), in.kv(), in.vv(), fine)) << dtype_name(d);
  }
}

TEST(ValidateOptions, AlibiSlopesMustBeOneFiniteFloatPerQueryHead) {
  expect_per_head_refusals("ALiBi slopes",
                           [](AttentionOptions& o, const TensorView& t) { o.alibi_slopes = t; });
}

TEST(ValidateOptions, SinksMustBeOneFiniteFloatPerQueryHead) {
  expect_per_head_refusals("sinks", [](AttentionOptions& o, const TensorView& t) { o.sinks = t; });
}

Tensor offsets64(const std::vector<std::int64_t>& x, const char* name) {
  return vector_tensor<std::int64_t>(DType::kI64, {static_cast<std::int64_t>(x.size())}, x, name);
}

TEST(ValidateOptions, PackedOffsetsMustBeIntegersFromZeroNonDecreasingToTheRowCount) {
  const Inputs in;  // total_q = 3, total_k = 5
  const Tensor good_q = offsets64({0, 1, 3}, "CQ.npy");
  const Tensor good_k = offsets64({0, 2, 5}, "CK.npy");
  const auto refused = [&](const Tensor& cq, const Tensor& ck, const std::string& subject,
                           const std::string& fragment) {
    AttentionOptions o;
    o.cu_seqlens_q = cq.view();
    o.cu_seqlens_k = ck.view();
    expect_refused(in, o, subject, fragment);
  };
  {
    AttentionOptions o;
    o.cu_seqlens_q = good_q.view();
    o.cu_seqlens_k = good_k.view();
    EXPECT_NO_THROW(attention(in.qv(), in.kv(), in.vv(), o));
  }
  refused(vector_tensor<float>(DType::kF32, {3}, {0, 1, 3}, "CQf.npy"), good_k, "CQf.npy",
          "cu_seqlens_q must hold int32 or int64 offsets, got float32");
  refused(good_q, vector_tensor<double>(DType::kF64, {3}, {0, 2, 5}, "CKf.npy"), "CKf.npy",
          "cu_seqlens_k must hold int32 or int64 offsets, got float64");
  refused(offsets64({1, 3}, "CQ1.npy"), offsets64({0, 5}, "CK.npy"), "CQ1.npy",
          "cu_seqlens_q must start at 0, got 1");
  refused(good_q, vector_tensor<std::int32_t>(DType::kI32, {3}, {-1, 2, 5}, "CKneg.npy"),
          "CKneg.npy", "cu_seqlens_k must start at 0, got -1");
  refused(offsets64({0, 2, 1, 3}, "CQd.npy"), offsets64({0, 1, 2, 5}, "CK.npy"), "CQd.npy",
          "cu_seqlens_q must be non-decreasing, got 2 then 1 at [2]");
  refused(offsets64({0, 2}, "CQe.npy"), offsets64({0, 5}, "CK.npy"), "CQe.npy",
          "cu_seqlens_q must end at Q.npy's 3 rows, got 2");
  refused(good_q, offsets64({0, 2, 9}, "CKe.npy"), "CKe.npy",
          "cu_seqlens_k must end at K.npy's 5 rows, got 9");
  refused(good_q, offsets64({0, 5}, "CK2.npy"), "CK2.npy",
          "cu_seqlens_k has 2 offsets but cu_seqlens_q has 3 (both B+1)");
  refused(offsets64({}, "CQ0.npy"), good_k, "CQ0.npy", "cu_seqlens_q must have shape [B+1]");
  refused(vector_tensor<std::int64_t>(DType::kI64, {1, 3}, {0, 1, 3}, "CQr.npy"), good_k,
          "CQr.npy", "cu_seqlens_q must have shape [B+1]");
}

TEST(ValidateOptions, PackedOffsetsComeInPairsWithoutMaskOrWeightsAndRankAtMostThree) {
  const Inputs in;
  const Tensor cq = offsets64({0, 1, 3}, "CQ.npy");
  const Tensor ck = offsets64({0, 2, 5}, "CK.npy");
  AttentionOptions only_q;
  only_q.cu_seqlens_q = cq.view();
  expect_refused(in, only_q, "cu_seqlens_k", "is needed too");
  AttentionOptions only_k;
  only_k.cu_seqlens_k = ck.view();
  expect_refused(in, only_k, "cu_seqlens_q", "is needed too");

  AttentionOptions both;
  both.cu_seqlens_q = cq.view();
  both.cu_seqlens_k = ck.view();
  const Tensor mask(DType::kBool, {3, 5}, "M.npy");
  AttentionOptions with_mask = both;
  with_mask.mask = mask.view();
  expect_refused(in, with_mask, "mask", "cannot be combined with a packed batch");

  AttentionOptions with_weights = both;
  with_weights.return_weights = true;
  EXPECT_THROW(
      {
        try {
          attention(in.qv(), in.kv(), in.vv(), with_weights);
        } catch (const Error& e) {
          EXPECT_EQ(e.subject(), "return_weights");
          EXPECT_NE(e.problem().find("cannot be combined with a packed batch"), std::string::npos);
          throw;
        }
      },
      Error);
  Tensor out(DType::kF32, {2, 3, 2}, "O");
  Tensor weights(DType::kF32, {2, 3, 5}, "W.npy");
  EXPECT_THROW(
      {
        try {
          attention_into(in.qv(), in.kv(), in.vv(), both,
                         {out.mutable_view(), weights.mutable_view(), {}});
        } catch (const Error& e) {
          EXPECT_EQ(e.subject(), "W.npy");
          EXPECT_NE(e.problem().find("cannot be combined with a packed batch"), std::string::npos);
          throw;
        }
      },
      Error);

  const Tensor q4 = testing::random_tensor(DType::kF32, {1, 2, 3, 4}, 4);
  const Tensor k4 = testing::random_tensor(DType::kF32, {1, 1, 5, 4}, 5);
  const Tensor v4 = testing::random_tensor(DType::kF32, {1, 1, 5, 2}, 6);
  try {
    attention(Inputs::named(q4, "Q4.npy"), k4.view(), v4.view(), both);
    ADD_FAILURE() << "a rank-4 packed call was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), "Q4.npy");
    EXPECT_NE(e.problem().find("a packed batch (cu_seqlens) takes Q as [H, total_q, D] or "
                               "[total_q, D]"),
              std::string::npos)
        << e.what();
  }
}

// Inputs must be finite (interface.md, "Errors"), and a row never gives NaN: a float32 value
// beyond float16's range (65504) rounded for dtype f16 becomes infinite. The call must refuse it,
// naming the tensor, or give finite results; q = [1e5, -1e5] against k = [1, 1] would otherwise
// make q·k = inf - inf = NaN.
TEST(ValidateOptions, ValuesBeyondTheStorageTypeAreRefusedOrStayFinite) {
  const Tensor q = vector_tensor<float>(DType::kF32, {1, 2}, {1e5f, -1e5f}, "Q.npy");
  const Tensor k = vector_tensor<float>(DType::kF32, {2, 2}, {1, 1, 0.5f, 0.25f}, "K.npy");
  const Tensor v = vector_tensor<float>(DType::kF32, {2, 1}, {1e5f, 1}, "V.npy");
  for (const std::string& kernel : {std::string(), std::string("reference")}) {
    SCOPED_TRACE(kernel.empty() ? "default kernel" : kernel);
    AttentionOptions o;
    o.dtype = DType::kF16;
    o.kernel = kernel;
    o.return_lse = true;
    try {
      const AttentionResult r = attention(q.view(), k.view(), v.view(), o);
      for (const Tensor* t : {&r.out, &r.lse}) {
        for (std::int64_t e = 0; e < t->numel(); ++e) {
          EXPECT_TRUE(std::isfinite(testing::element(t->view(), e)))
              << t->name() << "[" << e << "] = " << testing::element(t->view(), e);
        }
      }
    } catch (const Error& e) {
      EXPECT_TRUE(e.subject() == "Q.npy" || e.subject() == "V.npy") << e.what();
    }
  }
}

}  // namespace
}  // namespace qkv
