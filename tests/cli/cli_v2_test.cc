// End-to-end tests of the version 2 flags of `qkv attention` and `qkv layer`: --dtype, --softcap,
// --alibi, --alibi-slopes, --sinks, --cu-seqlens-q/-k and --out-dtype f16. Each run writes, bit
// for bit, what the library computes with the same options; each refused combination ends with
// one stderr line naming the flag or file and creates no file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "qkv/attention.h"
#include "qkv/io.h"
#include "qkv/layer.h"
#include "support/command_runner.h"
#include "support/refusal.h"
#include "support/test_support.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

using testing::CommandRun;
using testing::files_in;

constexpr std::int64_t kHeads = 4;

Tensor offsets(DType dtype, const std::vector<std::int64_t>& values, const std::string& name) {
  Tensor t(DType::kF64, {static_cast<std::int64_t>(values.size())}, name);
  for (std::size_t i = 0; i < values.size(); ++i) {
    t.data_as<double>()[i] = static_cast<double>(values[i]);
  }
  return t.to(dtype);
}

class CliV2 : public ::testing::Test {
 protected:
  void SetUp() override {
    q_ = testing::random_tensor(DType::kF32, {kHeads, 9, 8}, 11, -2.0, 2.0);
    k_ = testing::random_tensor(DType::kF32, {2, 11, 8}, 12, -2.0, 2.0);
    v_ = testing::random_tensor(DType::kF32, {2, 11, 5}, 13);
    slopes_ = testing::random_tensor(DType::kF32, {kHeads}, 14, 0.0, 1.0);
    sinks_ = testing::random_tensor(DType::kF64, {kHeads}, 15, -1.0, 2.0);
    save("q.npy", q_);
    save("k.npy", k_);
    save("v.npy", v_);
    save("slopes.npy", slopes_);
    save("sinks.npy", sinks_);
  }

  void save(const std::string& name, const Tensor& t) {
    write_npy(dir_ / name, t.view(), t.dtype());
  }

  CommandRun run(const std::vector<std::string>& args) {
    return testing::run_program(QKV_CLI_PATH, dir_.path(), args);
  }

  // `qkv attention` on q, k, v with `extra` flags, forced onto the reference kernel.
  std::vector<std::string> attention_args(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"attention", "--q",   "q.npy", "--k",      "k.npy",    "--v",
                                     "v.npy",     "--out", "o.npy", "--kernel", "reference"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // Runs `qkv attention ... extra --lse l.npy` and expects o.npy and l.npy to equal, bit for
  // bit, what attention() gives on the same inputs with `options` (kernel "reference").
  void expect_library_result(const std::vector<std::string>& extra, AttentionOptions options,
                             const Tensor* q = nullptr, const Tensor* k = nullptr,
                             const Tensor* v = nullptr) {
    std::vector<std::string> args = attention_args(extra);
    args.insert(args.end(), {"--lse", "l.npy"});
    const CommandRun r = run(args);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(r.err.empty()) << r.err;
    options.kernel = "reference";
    options.return_lse = true;
    const AttentionResult expected =
        attention((q ? q : &q_)->view(), (k ? k : &k_)->view(), (v ? v : &v_)->view(), options);
    const Tensor out = read_npy(dir_ / "o.npy");
    const Tensor lse = read_npy(dir_ / "l.npy");
    EXPECT_EQ(out.dtype(), expected.out.dtype());
    EXPECT_EQ(out.shape(), expected.out.shape());
    EXPECT_EQ(testing::max_abs_diff(out.view(), expected.out.view()), 0.0);
    EXPECT_EQ(testing::max_abs_diff(lse.view(), expected.lse.view()), 0.0);
  }

  // The refusal every bad input gets (support/refusal.h).
  void expect_refused(const std::vector<std::string>& args, const std::string& mentions) {
    testing::expect_refused(QKV_CLI_PATH, dir_.path(), args, mentions, {1, 127});
  }

  testing::ScratchDir dir_;
  Tensor q_, k_, v_, slopes_, sinks_;
};

TEST_F(CliV2, DtypeRoundsTheInputsAsTheLibraryDoes) {
  for (const auto& [word, dtype] :
       {std::pair{"f64", DType::kF64}, std::pair{"f32", DType::kF32},
        std::pair{"bf16", DType::kBF16}, std::pair{"f16", DType::kF16}}) {
    SCOPED_TRACE(word);
    AttentionOptions o;
    o.dtype = dtype;
    o.causal = true;
    expect_library_result({"--dtype", word, "--causal"}, o);
  }
  // bf16 rounding changes the answer: the flag is not ignored.
  ASSERT_EQ(run(attention_args({"--dtype", "bf16"})).status, 0);
  const Tensor bf16 = read_npy(dir_ / "o.npy");
  ASSERT_EQ(run(attention_args({})).status, 0);
  EXPECT_GT(testing::max_abs_diff(bf16.view(), read_npy(dir_ / "o.npy").view()), 1e-4);
}

TEST_F(CliV2, SoftcapReachesTheLibraryAndAHugeCapChangesLittle) {
  AttentionOptions o;
  o.softcap = 2.5;
  o.causal = true;
  o.scale = 1.0;
  expect_library_result({"--softcap", "2.5", "--causal", "--scale", "1"}, o);
  // C·tanh(x / C) -> x as C grows: numpy-free evidence that the cap is what is applied.
  const Tensor capped = read_npy(dir_ / "o.npy");
  ASSERT_EQ(run(attention_args({"--softcap", "1e6", "--causal", "--scale", "1"})).status, 0);
  const Tensor loose = read_npy(dir_ / "o.npy");
  ASSERT_EQ(run(attention_args({"--causal", "--scale", "1"})).status, 0);
  const Tensor plain = read_npy(dir_ / "o.npy");
  EXPECT_LT(testing::max_abs_diff(loose.view(), plain.view()), 1e-6);
  EXPECT_GT(testing::max_abs_diff(capped.view(), plain.view()), 1e-3);
}

TEST_F(CliV2, AlibiTakesTheStandardSlopesOrAFile) {
  AttentionOptions o;
  o.alibi = true;
  expect_library_result({"--alibi"}, o);
  // The standard slopes given as a file give the same bits.
  const Tensor standard_run = read_npy(dir_ / "o.npy");
  const std::vector<double> slopes = alibi_slopes(kHeads);
  Tensor standard(DType::kF64, {kHeads}, "standard");
  std::copy(slopes.begin(), slopes.end(), standard.data_as<double>());
  save("standard.npy", standard);
  ASSERT_EQ(run(attention_args({"--alibi-slopes", "standard.npy"})).status, 0);
  EXPECT_EQ(testing::max_abs_diff(standard_run.view(), read_npy(dir_ / "o.npy").view()), 0.0);

  AttentionOptions given;
  given.alibi_slopes = slopes_.view();
  given.window = Window{3, 1};
  expect_library_result({"--alibi-slopes", "slopes.npy", "--window", "3,1"}, given);
}

TEST_F(CliV2, SinksJoinTheDenominatorAndARowWithNoKeyHasLseSink) {
  AttentionOptions o;
  o.sinks = sinks_.view();
  o.softcap = 4.0;
  o.alibi = true;
  expect_library_result({"--sinks", "sinks.npy", "--softcap", "4", "--alibi"}, o);

  // Nq > Nk, causal: query rows 0 and 1 have no key; their lse is the head's sink, their output 0.
  const Tensor short_k = testing::random_tensor(DType::kF32, {2, 7, 8}, 16);
  const Tensor short_v = testing::random_tensor(DType::kF32, {2, 7, 5}, 17);
  save("k.npy", short_k);
  save("v.npy", short_v);
  AttentionOptions causal;
  causal.sinks = sinks_.view();
  causal.causal = true;
  expect_library_result({"--sinks", "sinks.npy", "--causal"}, causal, &q_, &short_k, &short_v);
  const Tensor lse = read_npy(dir_ / "l.npy");
  const Tensor out = read_npy(dir_ / "o.npy");
  for (std::int64_t h = 0; h < kHeads; ++h) {
    EXPECT_EQ(testing::element(lse.view(), h * 9 + 1),
              static_cast<float>(testing::element(sinks_.view(), h)));
    EXPECT_EQ(testing::element(out.view(), (h * 9 + 1) * 5), 0.0);
  }
}

TEST_F(CliV2, PackedBatchesTakeInt32AndInt64Offsets) {
  const Tensor q = testing::random_tensor(DType::kF32, {2, 12, 8}, 21);
  const Tensor k = testing::random_tensor(DType::kF32, {1, 15, 8}, 22);
  const Tensor v = testing::random_tensor(DType::kF32, {1, 15, 3}, 23);
  save("q.npy", q);
  save("k.npy", k);
  save("v.npy", v);
  // Sequences of 5, 0 and 7 query rows against 4, 6 and 5 keys.
  const Tensor cq32 = offsets(DType::kI32, {0, 5, 5, 12}, "cq");
  const Tensor ck64 = offsets(DType::kI64, {0, 4, 10, 15}, "ck");
  save("cq.npy", cq32);
  save("ck.npy", ck64);
  AttentionOptions o;
  o.cu_seqlens_q = cq32.view();
  o.cu_seqlens_k = ck64.view();
  o.causal = true;
  expect_library_result({"--cu-seqlens-q", "cq.npy", "--cu-seqlens-k", "ck.npy", "--causal"}, o, &q,
                        &k, &v);
  const Tensor packed = read_npy(dir_ / "o.npy");
  EXPECT_EQ(packed.shape(), (Shape{2, 12, 3}));

  // The last sequence alone, unpacked: the same rows (positions count within the sequence).
  save("q7.npy", contiguous_copy(
                     [&] {
                       TensorView rows = q.view();
                       rows.data = q.data_as<float>() + 5 * 8;
                       rows.shape = {2, 7, 8};
                       return rows;
                     }(),
                     DType::kF32));
  TensorView k_rows = k.view();
  k_rows.data = k.data_as<float>() + 10 * 8;
  k_rows.shape = {1, 5, 8};
  TensorView v_rows = v.view();
  v_rows.data = v.data_as<float>() + 10 * 3;
  v_rows.shape = {1, 5, 3};
  save("k5.npy", contiguous_copy(k_rows, DType::kF32));
  save("v5.npy", contiguous_copy(v_rows, DType::kF32));
  ASSERT_EQ(run({"attention", "--q", "q7.npy", "--k", "k5.npy", "--v", "v5.npy", "--out", "o7.npy",
                 "--causal", "--kernel", "reference"})
                .status,
            0);
  const Tensor alone = read_npy(dir_ / "o7.npy");
  for (std::int64_t h = 0; h < 2; ++h) {
    for (std::int64_t i = 0; i < 7 * 3; ++i) {
      EXPECT_EQ(testing::element(packed.view(), (h * 12 + 5) * 3 + i),
                testing::element(alone.view(), h * 7 * 3 + i));
    }
  }
}

TEST_F(CliV2, OutDtypeF16WritesHalfPrecision) {
  AttentionOptions o;
  o.out_dtype = DType::kF16;
  expect_library_result({"--out-dtype", "f16"}, o);
  const std::string bytes = testing::slurp(dir_ / "o.npy");
  EXPECT_NE(bytes.find("'descr': '<f2'"), std::string::npos);
  EXPECT_EQ(read_npy(dir_ / "l.npy").dtype(), DType::kF16);
}

TEST_F(CliV2, RefusedCombinationsNameTheFlags) {
  save("cq.npy", offsets(DType::kI32, {0, 9}, "cq"));
  save("ck.npy", offsets(DType::kI32, {0, 11}, "ck"));
  save("m.npy", testing::random_tensor(DType::kBool, {9, 11}, 3));
  const std::vector<std::string> packed = {"--cu-seqlens-q", "cq.npy", "--cu-seqlens-k", "ck.npy"};
  const auto with = [&](std::vector<std::string> extra, const std::vector<std::string>& more) {
    extra.insert(extra.end(), more.begin(), more.end());
    return attention_args(extra);
  };
  expect_refused(attention_args({"--alibi", "--alibi-slopes", "slopes.npy"}), "--alibi");
  expect_refused(attention_args({"--alibi", "--alibi-slopes", "slopes.npy"}), "--alibi-slopes");
  expect_refused(attention_args({"--cu-seqlens-q", "cq.npy"}), "--cu-seqlens-k");
  expect_refused(attention_args({"--cu-seqlens-k", "ck.npy"}), "--cu-seqlens-q");
  expect_refused(with(packed, {"--mask", "m.npy"}), "--mask");
  expect_refused(with(packed, {"--weights", "w.npy"}), "--weights");
  expect_refused(attention_args({"--dtype", "f8"}), "--dtype");
  expect_refused(attention_args({"--out-dtype", "bf16"}), "--out-dtype");
  for (const char* cap : {"0", "-1", "nan", "inf", "1e400", "two", ""}) {
    SCOPED_TRACE(cap);
    expect_refused(attention_args({"--softcap", cap}), "--softcap");
  }
}

TEST_F(CliV2, BadTensorFilesNameTheFile) {
  // Offsets: float, not from 0, decreasing, not ending at the row count, B differing.
  save("cf.npy", offsets(DType::kF32, {0, 9}, "cf"));
  save("ck.npy", offsets(DType::kI64, {0, 11}, "ck"));
  save("c1.npy", offsets(DType::kI32, {1, 9}, "c1"));
  save("cd.npy", offsets(DType::kI32, {0, 6, 4, 9}, "cd"));
  save("c8.npy", offsets(DType::kI32, {0, 8}, "c8"));
  save("c3.npy", offsets(DType::kI32, {0, 4, 9}, "c3"));
  for (const char* cq : {"cf.npy", "c1.npy", "cd.npy", "c8.npy"}) {
    expect_refused(attention_args({"--cu-seqlens-q", cq, "--cu-seqlens-k", "ck.npy"}), cq);
  }
  expect_refused(attention_args({"--cu-seqlens-q", "c3.npy", "--cu-seqlens-k", "ck.npy"}),
                 "ck.npy");
  expect_refused(attention_args({"--cu-seqlens-q", "c3.npy", "--cu-seqlens-k", "cf.npy"}),
                 "cf.npy: dtype '<f4' cannot hold sequence offsets");
  expect_refused(attention_args({"--cu-seqlens-q", "absent.npy", "--cu-seqlens-k", "ck.npy"}),
                 "absent.npy");
  // A 4-D Q cannot be packed.
  save("q4.npy", testing::random_tensor(DType::kF32, {1, kHeads, 9, 8}, 1));
  std::vector<std::string> args =
      attention_args({"--cu-seqlens-q", "c8.npy", "--cu-seqlens-k", "ck.npy"});
  args[2] = "q4.npy";
  expect_refused(args, "q4.npy");

  // Integer files are read for the offsets only.
  save("qi.npy", offsets(DType::kI32, {0, 1, 2}, "qi"));
  args = attention_args({});
  args[2] = "qi.npy";
  expect_refused(args, "qi.npy: integer dtype '<i4' is not supported");
  expect_refused(attention_args({"--sinks", "ck.npy"}), "ck.npy: integer dtype '<i8'");

  // Slopes and sinks: one finite float per query head.
  save("s3.npy", testing::random_tensor(DType::kF32, {3}, 5));
  Tensor nan_sinks = testing::random_tensor(DType::kF32, {kHeads}, 6);
  nan_sinks.data_as<float>()[2] = std::nanf("");
  save("snan.npy", nan_sinks);
  expect_refused(attention_args({"--sinks", "s3.npy"}), "s3.npy");
  expect_refused(attention_args({"--sinks", "snan.npy"}), "snan.npy");
  expect_refused(attention_args({"--alibi-slopes", "s3.npy"}), "s3.npy");
  expect_refused(attention_args({"--alibi-slopes", "snan.npy"}), "snan.npy");
}

// The layer's weights for X [.., N, 10]: 4 query heads and 2 kv heads of width 2, dv 3.
class CliV2Layer : public CliV2 {
 protected:
  void SetUp() override {
    CliV2::SetUp();
    wq_ = testing::random_tensor(DType::kF32, {10, 8}, 31);
    wk_ = testing::random_tensor(DType::kF32, {10, 4}, 32);
    wv_ = testing::random_tensor(DType::kF32, {10, 6}, 33);
    save("wq.npy", wq_);
    save("wk.npy", wk_);
    save("wv.npy", wv_);
  }

  std::vector<std::string> layer_args(const std::string& x, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"layer",    "--x",        x,      "--wq",   "wq.npy",
                                     "--wk",     "wk.npy",     "--wv", "wv.npy", "--heads",
                                     "4",        "--kv-heads", "2",    "--out",  "o.npy",
                                     "--kernel", "reference"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  LayerResult library_layer(const Tensor& x, AttentionOptions attention_options) {
    LayerOptions o;
    o.heads = 4;
    o.kv_heads = 2;
    o.attention = std::move(attention_options);
    o.attention.kernel = "reference";
    return multi_head_attention(x.view(), LayerWeights{wq_.view(), wk_.view(), wv_.view()}, o);
  }

  Tensor wq_, wk_, wv_;
};

TEST_F(CliV2Layer, TheOptionsReachAttentionOnTheProjections) {
  const Tensor x = testing::random_tensor(DType::kF32, {2, 6, 10}, 34);
  save("x.npy", x);
  const CommandRun r =
      run(layer_args("x.npy", {"--dtype", "bf16", "--softcap", "3", "--alibi", "--sinks",
                               "sinks.npy", "--causal", "--lse", "l.npy"}));
  ASSERT_EQ(r.status, 0) << r.err;
  AttentionOptions o;
  o.dtype = DType::kBF16;
  o.softcap = 3.0;
  o.alibi = true;
  o.sinks = sinks_.view();
  o.causal = true;
  o.return_lse = true;
  const LayerResult expected = library_layer(x, o);
  EXPECT_EQ(testing::max_abs_diff(read_npy(dir_ / "o.npy").view(), expected.out.view()), 0.0);
  EXPECT_EQ(testing::max_abs_diff(read_npy(dir_ / "l.npy").view(), expected.lse.view()), 0.0);

  // --dtype bf16 rounds the projected Q, K, V: the answer moves.
  ASSERT_EQ(
      run(layer_args("x.npy", {"--softcap", "3", "--alibi", "--sinks", "sinks.npy", "--causal"}))
          .status,
      0);
  EXPECT_GT(testing::max_abs_diff(read_npy(dir_ / "o.npy").view(), expected.out.view()), 1e-4);

  // float16 outputs: the float32 result rounded once.
  ASSERT_EQ(run(layer_args("x.npy", {"--out-dtype", "f16", "--lse", "l.npy"})).status, 0);
  AttentionOptions plain;
  plain.return_lse = true;
  const LayerResult f32 = library_layer(x, plain);
  const Tensor out = read_npy(dir_ / "o.npy");
  EXPECT_EQ(out.dtype(), DType::kF16);
  EXPECT_EQ(testing::max_abs_diff(out.view(), f32.out.to(DType::kF16).view()), 0.0);
  EXPECT_EQ(testing::max_abs_diff(read_npy(dir_ / "l.npy").view(), f32.lse.to(DType::kF16).view()),
            0.0);
}

TEST_F(CliV2Layer, PackedBatchesCutTheRowsOfX) {
  const Tensor x = testing::random_tensor(DType::kF32, {12, 10}, 35);
  save("x.npy", x);
  const Tensor cu = offsets(DType::kI64, {0, 5, 5, 12}, "cu");
  save("cu.npy", cu);
  const CommandRun r = run(layer_args("x.npy", {"--cu-seqlens-q", "cu.npy", "--cu-seqlens-k",
                                                "cu.npy", "--causal", "--lse", "l.npy"}));
  ASSERT_EQ(r.status, 0) << r.err;
  AttentionOptions o;
  o.cu_seqlens_q = cu.view();
  o.cu_seqlens_k = cu.view();
  o.causal = true;
  o.return_lse = true;
  const LayerResult expected = library_layer(x, o);
  const Tensor packed = read_npy(dir_ / "o.npy");
  EXPECT_EQ(packed.shape(), (Shape{12, 12}));
  EXPECT_EQ(testing::max_abs_diff(packed.view(), expected.out.view()), 0.0);
  EXPECT_EQ(read_npy(dir_ / "l.npy").shape(), (Shape{4, 12}));

  // The last sequence alone gives its rows (within rounding: its projections are other GEMMs).
  TensorView rows = x.view();
  rows.data = x.data_as<float>() + 5 * 10;
  rows.shape = {7, 10};
  save("x7.npy", contiguous_copy(rows, DType::kF32));
  ASSERT_EQ(run(layer_args("x7.npy", {"--causal"})).status, 0);
  const Tensor alone = read_npy(dir_ / "o.npy");
  for (std::int64_t i = 0; i < 7 * 12; ++i) {
    EXPECT_NEAR(testing::element(packed.view(), 5 * 12 + i), testing::element(alone.view(), i),
                1e-5);
  }

  save("x3.npy", testing::random_tensor(DType::kF32, {1, 12, 10}, 36));
  expect_refused(layer_args("x3.npy", {"--cu-seqlens-q", "cu.npy", "--cu-seqlens-k", "cu.npy"}),
                 "x3.npy: a packed batch");
  expect_refused(layer_args("x.npy", {"--cu-seqlens-q", "cu.npy", "--cu-seqlens-k", "cu.npy",
                                      "--weights", "w.npy"}),
                 "--weights");
  // A library error about an option reaches the user under the flag's spelling.
  std::vector<std::string> args = layer_args("x.npy", {});
  args[12] = "3";  // --kv-heads 3 for 4 heads
  expect_refused(args, "--kv-heads: 3 kv heads do not divide 4");
}

TEST_F(CliV2, HelpNamesEveryNewFlag) {
  for (const char* command : {"attention", "layer"}) {
    const CommandRun r = run({command, "--help"});
    ASSERT_EQ(r.status, 0);
    for (const char* flag : {"--dtype", "--softcap", "--alibi", "--alibi-slopes", "--sinks",
                             "--cu-seqlens-q", "--cu-seqlens-k", "f16"}) {
      EXPECT_NE(r.out.find(flag), std::string::npos) << command << " " << flag;
    }
  }
}

}  // namespace
}  // namespace qkv
