// Weights from model files, end to end through the qkv executable: a GPT-2-style checkpoint
// (fused c_attn [d, 3d] in the X·W layout, split by --wqkv/--bqkv) and a BERT-style one
// (separate nn.Linear weights [out, in], transposed by --linear-layout), in F32, F16 and BF16,
// each against the library run on the same weights laid out by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/command_runner.h"
#include "io/safetensors_builder.h"
#include "qkv/io.h"
#include "qkv/layer.h"
#include "support/test_support.h"

namespace qkv {
namespace {

using testing::safetensors_bytes;
using testing::safetensors_item;

testing::CommandRun run_qkv(const testing::ScratchDir& dir, const std::vector<std::string>& args) {
  return testing::run_program(QKV_CLI_PATH, dir.path(), args);
}

Tensor transpose(const Tensor& t) {
  TensorView view = t.view();
  view.shape = {t.shape()[1], t.shape()[0]};
  view.strides = {1, t.shape()[1]};
  return contiguous_copy(view, t.dtype());
}

// Columns [begin, end) of a matrix (or entries of a vector), copied.
Tensor columns(const Tensor& t, std::int64_t begin, std::int64_t end) {
  TensorView view = t.view();
  view.data =
      static_cast<const char*>(t.data()) + static_cast<std::size_t>(begin) * dtype_size(t.dtype());
  view.shape.back() = end - begin;
  return contiguous_copy(view, t.dtype());
}

void expect_one_failure_line(const testing::CommandRun& run, const std::string& mentions) {
  EXPECT_NE(run.status, 0);
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_NE(run.err.find(mentions), std::string::npos) << run.err;
}

class ModelFiles : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelFiles, Gpt2StyleFusedProjection) {
  const std::string dtype = GetParam();
  constexpr std::int64_t kD = 24, kHeads = 4, kN = 7;
  testing::ScratchDir dir;
  const Tensor x = testing::random_tensor(DType::kF32, {2, kN, kD}, 11);
  write_npy(dir / "hidden.npy", x.view(), DType::kF32);
  // GPT-2's Conv1D stores c_attn.weight as [d, 3d] and c_proj.weight as [d, d]: X·W already.
  const Tensor c_attn_w = testing::random_tensor(DType::kF32, {kD, 3 * kD}, 12, -0.3, 0.3);
  const Tensor c_attn_b = testing::random_tensor(DType::kF32, {3 * kD}, 13, -0.1, 0.1);
  const Tensor c_proj_w = testing::random_tensor(DType::kF32, {kD, kD}, 14, -0.3, 0.3);
  const Tensor c_proj_b = testing::random_tensor(DType::kF32, {kD}, 15, -0.1, 0.1);
  const Tensor ln = testing::random_tensor(DType::kF32, {kD}, 16);
  testing::write_bytes(
      dir / "model.safetensors",
      safetensors_bytes({safetensors_item("h.0.ln_1.weight", ln, dtype),
                         safetensors_item("h.0.attn.c_attn.weight", c_attn_w, dtype),
                         safetensors_item("h.0.attn.c_attn.bias", c_attn_b, dtype),
                         safetensors_item("h.0.attn.c_proj.weight", c_proj_w, dtype),
                         safetensors_item("h.0.attn.c_proj.bias", c_proj_b, dtype)},
                        R"({"format":"pt"})"));
  const std::string m = "model.safetensors:h.0.attn.";
  const testing::CommandRun run =
      run_qkv(dir, {"layer", "--x", "hidden.npy", "--wqkv", m + "c_attn.weight", "--bqkv",
                    m + "c_attn.bias", "--wo", m + "c_proj.weight", "--bo", m + "c_proj.bias",
                    "--heads", "4", "--causal", "--out", "out.npy", "--threads", "2"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_TRUE(run.err.empty()) << run.err;

  // The same layer from the weights as the reader keeps them (16-bit ones too), split by hand.
  const auto stored = [&](const char* name) {
    return read_safetensors_tensor(dir / "model.safetensors", std::string("h.0.attn.") + name);
  };
  const Tensor w = stored("c_attn.weight"), b = stored("c_attn.bias");
  const Tensor wq = columns(w, 0, kD), wk = columns(w, kD, 2 * kD), wv = columns(w, 2 * kD, 3 * kD);
  const Tensor bq = columns(b, 0, kD), bk = columns(b, kD, 2 * kD), bv = columns(b, 2 * kD, 3 * kD);
  const Tensor wo = stored("c_proj.weight"), bo = stored("c_proj.bias");
  LayerWeights weights{wq.view(), wk.view(), wv.view()};
  weights.bq = bq.view();
  weights.bk = bk.view();
  weights.bv = bv.view();
  weights.wo = wo.view();
  weights.bo = bo.view();
  LayerOptions options;
  options.heads = kHeads;
  options.attention.causal = true;
  options.attention.threads = 2;
  const LayerResult expected = multi_head_attention(x.view(), weights, options);
  const Tensor out = read_npy(dir / "out.npy");
  EXPECT_EQ(out.shape(), (Shape{2, kN, kD}));
  EXPECT_EQ(testing::max_abs_diff(out.view(), expected.out.view()), 0.0);
  if (dtype == std::string("F32")) {
    EXPECT_EQ(testing::max_abs_diff(w.view(), c_attn_w.view()), 0.0);
  }
}

TEST_P(ModelFiles, BertStyleLinearLayout) {
  const std::string dtype = GetParam();
  constexpr std::int64_t kD = 16, kHeads = 2, kN = 9;
  testing::ScratchDir dir;
  const Tensor x = testing::random_tensor(DType::kF32, {kN, kD}, 21);
  write_npy(dir / "hidden.npy", x.view(), DType::kF32);
  // nn.Linear stores weight as [out, in]; y = x·W^T + b.
  const std::string p = "bert.encoder.layer.0.attention.";
  std::vector<testing::SafetensorsItem> items;
  std::vector<Tensor> linear;
  std::uint64_t seed = 22;
  for (const char* name : {"self.query", "self.key", "self.value", "output.dense"}) {
    linear.push_back(testing::random_tensor(DType::kF32, {kD, kD}, seed++, -0.4, 0.4));
    linear.push_back(testing::random_tensor(DType::kF32, {kD}, seed++, -0.1, 0.1));
    items.push_back(safetensors_item(p + name + ".weight", linear[linear.size() - 2], dtype));
    items.push_back(safetensors_item(p + name + ".bias", linear.back(), dtype));
  }
  testing::write_bytes(dir / "bert.safetensors", safetensors_bytes(items));
  const std::string f = "bert.safetensors:" + p;
  const testing::CommandRun run = run_qkv(dir, {"layer",      "--x",
                                                "hidden.npy", "--linear-layout",
                                                "--wq",       f + "self.query.weight",
                                                "--bq",       f + "self.query.bias",
                                                "--wk",       f + "self.key.weight",
                                                "--bk",       f + "self.key.bias",
                                                "--wv",       f + "self.value.weight",
                                                "--bv",       f + "self.value.bias",
                                                "--wo",       f + "output.dense.weight",
                                                "--bo",       f + "output.dense.bias",
                                                "--heads",    "2",
                                                "--out",      "out.npy",
                                                "--weights",  "w.npy"});
  ASSERT_EQ(run.status, 0) << run.err;

  const auto stored = [&](const std::string& name) {
    return read_safetensors_tensor(dir / "bert.safetensors", p + name);
  };
  const Tensor wq = transpose(stored("self.query.weight"));
  const Tensor wk = transpose(stored("self.key.weight"));
  const Tensor wv = transpose(stored("self.value.weight"));
  const Tensor wo = transpose(stored("output.dense.weight"));
  const Tensor bq = stored("self.query.bias"), bk = stored("self.key.bias");
  const Tensor bv = stored("self.value.bias"), bo = stored("output.dense.bias");
  LayerWeights weights{wq.view(), wk.view(), wv.view()};
  weights.bq = bq.view();
  weights.bk = bk.view();
  weights.bv = bv.view();
  weights.wo = wo.view();
  weights.bo = bo.view();
  LayerOptions options;
  options.heads = kHeads;
  options.attention.return_weights = true;
  const LayerResult expected = multi_head_attention(x.view(), weights, options);
  EXPECT_EQ(testing::max_abs_diff(read_npy(dir / "out.npy").view(), expected.out.view()), 0.0);
  EXPECT_EQ(testing::max_abs_diff(read_npy(dir / "w.npy").view(), expected.weights.view()), 0.0);

  // Without --linear-layout the same square weights are used untransposed: a different result.
  ASSERT_EQ(run_qkv(dir, {"layer", "--x", "hidden.npy", "--wq", f + "self.query.weight", "--wk",
                          f + "self.key.weight", "--wv", f + "self.value.weight", "--heads", "2",
                          "--out", "plain.npy"})
                .status,
            0);
  EXPECT_GT(testing::max_abs_diff(read_npy(dir / "plain.npy").view(), expected.out.view()), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ModelFiles, ::testing::Values("F32", "F16", "BF16", "F64"));

TEST(ModelFilesCli, AttentionTensorsFromASafetensorsFile) {
  testing::ScratchDir dir;
  const Tensor q = testing::random_tensor(DType::kF32, {2, 5, 8}, 31);
  const Tensor k = testing::random_tensor(DType::kF32, {2, 6, 8}, 32);
  const Tensor v = testing::random_tensor(DType::kF64, {2, 6, 4}, 33);
  testing::write_bytes(
      dir / "qkv.safetensors",
      safetensors_bytes({safetensors_item("q", q, "F32"), safetensors_item("k", k, "F32"),
                         safetensors_item("v", v, "F64")}));
  const testing::CommandRun run =
      run_qkv(dir, {"attention", "--q", "qkv.safetensors:q", "--k", "qkv.safetensors:k", "--v",
                    "qkv.safetensors:v", "--out", "o.npy"});
  ASSERT_EQ(run.status, 0) << run.err;
  const AttentionResult expected = attention(q.view(), k.view(), v.view());
  EXPECT_EQ(testing::max_abs_diff(read_npy(dir / "o.npy").view(), expected.out.view()), 0.0);
}

TEST(ModelFilesCli, LayoutErrorsNameTheFlagOrTheTensor) {
  testing::ScratchDir dir;
  const Tensor x = testing::random_tensor(DType::kF32, {4, 12}, 41);
  write_npy(dir / "x.npy", x.view(), DType::kF32);
  const Tensor w = testing::random_tensor(DType::kF32, {12, 36}, 42);
  const Tensor b3 = testing::random_tensor(DType::kF32, {2, 2, 2}, 43);
  testing::write_bytes(dir / "m.safetensors",
                       safetensors_bytes({safetensors_item("c_attn.weight", w, "F32"),
                                          safetensors_item("odd", b3, "F32")}));
  const std::vector<std::string> before = testing::files_in(dir.path());
  expect_one_failure_line(
      run_qkv(dir, {"layer", "--x", "x.npy", "--wqkv", "m.safetensors:c_attn.weight", "--heads",
                    "5", "--out", "o.npy"}),
      "m.safetensors:c_attn.weight");
  expect_one_failure_line(
      run_qkv(dir, {"layer", "--x", "x.npy", "--wqkv", "m.safetensors:c_attn.weight", "--wq",
                    "x.npy", "--heads", "3", "--out", "o.npy"}),
      "--wqkv");
  expect_one_failure_line(
      run_qkv(dir, {"layer", "--x", "x.npy", "--wq", "m.safetensors:c_attn.weight", "--heads", "3",
                    "--out", "o.npy"}),
      "--wk");
  expect_one_failure_line(run_qkv(dir, {"layer", "--x", "x.npy", "--linear-layout", "--wqkv",
                                        "m.safetensors:odd", "--heads", "3", "--out", "o.npy"}),
                          "m.safetensors:odd");
  expect_one_failure_line(run_qkv(dir, {"layer", "--x", "x.npy", "--wqkv", "m.safetensors:nope",
                                        "--heads", "3", "--out", "o.npy"}),
                          "m.safetensors");
  expect_one_failure_line(run_qkv(dir, {"layer", "--x", "x.npy", "--wqkv", "m.safetensors",
                                        "--heads", "3", "--out", "o.npy"}),
                          "m.safetensors:NAME");
  EXPECT_EQ(testing::files_in(dir.path()), before);
  // The fused weight with 3 heads: fine.
  EXPECT_EQ(run_qkv(dir, {"layer", "--x", "x.npy", "--wqkv", "m.safetensors:c_attn.weight",
                          "--heads", "3", "--out", "o.npy"})
                .status,
            0);
}

}  // namespace
}  // namespace qkv
