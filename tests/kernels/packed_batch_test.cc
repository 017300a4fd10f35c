// Packed variable-length batches (interface.md, version 2): a call with cu_seqlens_q/k equals
// one call per sequence on that sequence's rows, with causal, window and ALiBi counted within
// each sequence (bottom-right per sequence). The reference runs the same float64 arithmetic
// either way, so the comparison is bitwise; every other kernel that accepts a packed call is
// held to the reference by the modifier sweep.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv::testing {
namespace {

struct Packed {
  std::vector<std::int64_t> q_lens, k_lens;
  std::int64_t h = 4, hkv = 2, d = 5, dv = 3;
};

std::vector<std::int64_t> offsets(const std::vector<std::int64_t>& lens) {
  std::vector<std::int64_t> cu = {0};
  for (const std::int64_t n : lens) cu.push_back(cu.back() + n);
  return cu;
}

Tensor offsets_tensor(const std::vector<std::int64_t>& cu, DType dtype, const char* name) {
  Tensor t(dtype, {static_cast<std::int64_t>(cu.size())}, name);
  for (std::size_t i = 0; i < cu.size(); ++i) {
    if (dtype == DType::kI32) {
      t.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(cu[i]);
    } else {
      t.data_as<std::int64_t>()[i] = cu[i];
    }
  }
  return t;
}

// Rows r0..r1 of every head of a [H, N, W] tensor, as a new [H, r1 - r0, W] float64 tensor.
Tensor rows_of(const Tensor& t, std::int64_t r0, std::int64_t r1) {
  const std::int64_t heads = t.shape()[0], n = t.shape()[1], w = t.shape()[2];
  Tensor s(DType::kF64, {heads, r1 - r0, w}, t.name());
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t r = r0; r < r1; ++r) {
      for (std::int64_t c = 0; c < w; ++c) {
        s.data_as<double>()[(h * (r1 - r0) + r - r0) * w + c] = element(t.view(), (h * n + r) * w + c);
      }
    }
  }
  return s;
}

struct Combo {
  const char* name;
  void (*edit)(AttentionOptions&);
};

// Holds the sinks tensor the options point at.
const Tensor& sinks_tensor() {
  static const Tensor t = [] {
    Tensor s(DType::kF32, {4}, "sinks");
    const float x[] = {0.5f, -1.0f, 2.0f, 0.0f};
    std::memcpy(s.data(), x, sizeof x);
    return s;
  }();
  return t;
}

const Combo kCombos[] = {
    {"plain", [](AttentionOptions&) {}},
    {"causal", [](AttentionOptions& o) { o.causal = true; }},
    {"window", [](AttentionOptions& o) { o.window = Window{1, 0}; }},
    {"alibi", [](AttentionOptions& o) { o.alibi = true; }},
    {"causal_alibi_softcap_sinks",
     [](AttentionOptions& o) {
       o.causal = true;
       o.alibi = true;
       o.softcap = 1.5;
       o.sinks = sinks_tensor().view();
     }},
    {"window_sinks", [](AttentionOptions& o) {
       o.window = Window{-1, 1};
       o.sinks = sinks_tensor().view();
     }},
};

void expect_packed_equals_per_sequence(const Packed& pk, DType offset_dtype, bool rank2) {
  const std::vector<std::int64_t> cu_q = offsets(pk.q_lens), cu_k = offsets(pk.k_lens);
  const std::int64_t h = rank2 ? 1 : pk.h, hkv = rank2 ? 1 : pk.hkv;
  const Tensor q = random_tensor(DType::kF64, {h, cu_q.back(), pk.d}, 1, -2.0, 2.0);
  const Tensor k = random_tensor(DType::kF64, {hkv, cu_k.back(), pk.d}, 2, -2.0, 2.0);
  const Tensor v = random_tensor(DType::kF64, {hkv, cu_k.back(), pk.dv}, 3);
  const Tensor tq = offsets_tensor(cu_q, offset_dtype, "cu_q");
  const Tensor tk = offsets_tensor(cu_k, offset_dtype, "cu_k");
  auto as_rank = [&](const Tensor& t) {
    TensorView view = t.view();
    if (rank2) {
      view.shape.erase(view.shape.begin());
      view.strides.erase(view.strides.begin());
    }
    return view;
  };
  for (const Combo& combo : kCombos) {
    SCOPED_TRACE(combo.name);
    AttentionOptions o;
    o.kernel = "reference";
    o.out_dtype = DType::kF64;
    o.return_lse = true;
    combo.edit(o);
    Tensor one_sink;
    if (rank2 && o.sinks) {  // one head: the first sink
      one_sink = Tensor(DType::kF32, {1}, "sinks");
      one_sink.data_as<float>()[0] = sinks_tensor().data_as<float>()[0];
      o.sinks = one_sink.view();
    }
    AttentionOptions packed = o;
    packed.cu_seqlens_q = tq.view();
    packed.cu_seqlens_k = tk.view();
    const AttentionResult all = attention(as_rank(q), as_rank(k), as_rank(v), packed);
    ASSERT_EQ(all.out.shape(), rank2 ? Shape({cu_q.back(), pk.dv}) : Shape({h, cu_q.back(), pk.dv}));
    ASSERT_EQ(all.lse.shape(), rank2 ? Shape({cu_q.back()}) : Shape({h, cu_q.back()}));
    for (std::size_t s = 0; s + 1 < cu_q.size(); ++s) {
      SCOPED_TRACE("sequence " + std::to_string(s));
      const Tensor sq = rows_of(q, cu_q[s], cu_q[s + 1]);
      const Tensor sk = rows_of(k, cu_k[s], cu_k[s + 1]);
      const Tensor sv = rows_of(v, cu_k[s], cu_k[s + 1]);
      const AttentionResult one = attention(sq.view(), sk.view(), sv.view(), o);
      const std::int64_t n = cu_q[s + 1] - cu_q[s];
      for (std::int64_t hh = 0; hh < h; ++hh) {
        for (std::int64_t i = 0; i < n; ++i) {
          const std::int64_t row = hh * cu_q.back() + cu_q[s] + i;
          EXPECT_EQ(all.lse.data_as<double>()[row], one.lse.data_as<double>()[hh * n + i]);
          for (std::int64_t c = 0; c < pk.dv; ++c) {
            EXPECT_EQ(all.out.data_as<double>()[row * pk.dv + c],
                      one.out.data_as<double>()[(hh * n + i) * pk.dv + c]);
          }
        }
      }
      if (n > 0 && cu_k[s + 1] == cu_k[s]) {  // queries without keys: zeros, lse -inf or sink
        const double want = o.sinks ? element(*o.sinks, 0) : -std::numeric_limits<double>::infinity();
        EXPECT_EQ(all.lse.data_as<double>()[cu_q[s]], want);
        EXPECT_EQ(all.out.data_as<double>()[cu_q[s] * pk.dv], 0.0);
      }
    }
  }
}

// Sequences with queries and no keys, keys and no queries, both empty, Nq < Nk and Nq > Nk.
const Packed kRagged{{3, 0, 5, 2, 0, 4, 1}, {0, 4, 5, 7, 0, 2, 1}};

TEST(PackedBatch, EqualsOneCallPerSequenceInt32Offsets) {
  expect_packed_equals_per_sequence(kRagged, DType::kI32, false);
}

TEST(PackedBatch, EqualsOneCallPerSequenceInt64Offsets) {
  expect_packed_equals_per_sequence(kRagged, DType::kI64, false);
}

TEST(PackedBatch, EqualsOneCallPerSequenceRankTwo) {
  expect_packed_equals_per_sequence(kRagged, DType::kI64, true);
}

TEST(PackedBatch, PositionsCountWithinEachSequence) {
  // Two sequences of 3 queries and 3 keys: causal within each differs from causal over the
  // packed 6 x 6, where the second sequence's queries would see the first one's keys.
  const Tensor q = random_tensor(DType::kF64, {1, 6, 4}, 4);
  const Tensor k = random_tensor(DType::kF64, {1, 6, 4}, 5);
  const Tensor v = random_tensor(DType::kF64, {1, 6, 2}, 6);
  const Tensor cu = offsets_tensor({0, 3, 6}, DType::kI32, "cu");
  AttentionOptions o;
  o.kernel = "reference";
  o.out_dtype = DType::kF64;
  o.causal = true;
  const AttentionResult whole = attention(q.view(), k.view(), v.view(), o);
  o.cu_seqlens_q = o.cu_seqlens_k = cu.view();
  const AttentionResult packed = attention(q.view(), k.view(), v.view(), o);
  for (std::int64_t e = 0; e < 3 * 2; ++e) {  // the first sequence: the same rows and keys
    EXPECT_EQ(packed.out.data_as<double>()[e], whole.out.data_as<double>()[e]);
  }
  // Query 3 (the second sequence's first) sees key 3 only: its output is v_3.
  EXPECT_EQ(packed.out.data_as<double>()[3 * 2], v.data_as<double>()[3 * 2]);
  EXPECT_NE(whole.out.data_as<double>()[3 * 2], v.data_as<double>()[3 * 2]);
}

TEST(PackedBatch, NoSequencesAtAll) {
  const Tensor q(DType::kF32, {2, 0, 4}, "Q");
  const Tensor k(DType::kF32, {1, 0, 4}, "K");
  const Tensor v(DType::kF32, {1, 0, 3}, "V");
  const Tensor cu = offsets_tensor({0}, DType::kI64, "cu");
  for (const std::string& name : attention_kernel_names()) {
    SCOPED_TRACE(name);
    AttentionOptions o;
    o.kernel = name;
    o.return_lse = true;
    o.cu_seqlens_q = o.cu_seqlens_k = cu.view();
    AttentionResult r;
    try {
      r = attention(q.view(), k.view(), v.view(), o);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot run this call"), std::string::npos) << e.what();
      continue;
    }
    EXPECT_EQ(r.out.shape(), (Shape{2, 0, 3}));
    EXPECT_EQ(r.lse.shape(), (Shape{2, 0}));
  }
}

}  // namespace
}  // namespace qkv::testing
