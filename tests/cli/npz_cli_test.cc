// FILE.npz:NAME at the command line: every command that takes tensor files gives, from the
// arrays of an .npz archive (stored or deflated), the bytes it gives from the same arrays as
// .npy files; an archive member over --max-memory is refused from its header before it is
// inflated; and a hostile archive in any tensor position ends the command with one line and no
// output.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "io/npz_builder.h"
#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/refusal.h"
#include "support/test_support.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

using testing::CommandRun;
using testing::files_in;
using testing::NpzMember;
using testing::slurp;

constexpr int kTimeoutSeconds = 60;

class NpzCli : public ::testing::Test {
 protected:
  void SetUp() override {
    // Attention: q [2, 5, 8], k and v [2, 7, 8], a float mask [5, 7]. Layer: x [6, 8] and four
    // [8, 8] weights.
    add("q", testing::random_tensor(DType::kF32, {2, 5, 8}, 1));
    add("k", testing::random_tensor(DType::kF32, {2, 7, 8}, 2));
    add("v", testing::random_tensor(DType::kF32, {2, 7, 8}, 3));
    add("m", testing::random_tensor(DType::kF32, {5, 7}, 4));
    add("x", testing::random_tensor(DType::kF32, {6, 8}, 5));
    for (const char* w : {"wq", "wk", "wv", "wo"})
      add(w, testing::random_tensor(DType::kF32, {8, 8}, 6));
    std::vector<NpzMember> stored, deflated;
    for (const auto& [name, bytes] : arrays_) {
      stored.push_back({name + ".npy", bytes, false});
      deflated.push_back({name + ".npy", bytes, true});
    }
    testing::write_npz(dir_ / "s.npz", stored);
    testing::write_npz(dir_ / "c.npz", deflated);
  }

  void add(const std::string& name, const Tensor& t) {
    write_npy(dir_ / (name + ".npy"), t.view(), DType::kF32);
    arrays_.emplace_back(name, encode_npy(t.view(), DType::kF32));
  }

  CommandRun run(const std::vector<std::string>& args) {
    return testing::run_program(QKV_CLI_PATH, dir_.path(), args, kTimeoutSeconds);
  }

  // Each "@NAME" in `args` becomes NAME.npy, then s.npz:NAME, then c.npz:NAME; the three runs
  // must succeed and write the same bytes to each of `outputs`.
  void expect_same_outputs(const std::vector<std::string>& args,
                           const std::vector<std::string>& outputs) {
    std::vector<std::string> first;
    for (const char* form : {"npy", "s.npz", "c.npz"}) {
      SCOPED_TRACE(form);
      std::vector<std::string> spelled = args;
      for (std::string& arg : spelled) {
        if (!arg.starts_with("@")) continue;
        const std::string name = arg.substr(1);
        arg = std::string(form) == "npy" ? name + ".npy" : std::string(form) + ":" + name;
      }
      const CommandRun r = run(spelled);
      ASSERT_EQ(r.status, 0) << r.err;
      std::vector<std::string> written;
      for (const std::string& out : outputs) written.push_back(slurp(dir_ / out));
      if (first.empty()) {
        first = written;
        for (const std::string& bytes : first) EXPECT_FALSE(bytes.empty());
      } else {
        EXPECT_EQ(written, first);
      }
    }
  }

  // The refusal every bad input gets (support/refusal.h).
  void expect_refused(const std::vector<std::string>& args, const std::string& mentions) {
    testing::expect_refused(QKV_CLI_PATH, dir_.path(), args, mentions, {}, kTimeoutSeconds);
  }

  testing::ScratchDir dir_;
  std::vector<std::pair<std::string, std::vector<char>>> arrays_;
};

TEST_F(NpzCli, AttentionGivesTheBytesOfTheNpyRun) {
  expect_same_outputs({"attention", "--q", "@q", "--k", "@k", "--v", "@v", "--mask", "@m", "--out",
                       "o.npy", "--weights", "w.npy", "--lse", "l.npy"},
                      {"o.npy", "w.npy", "l.npy"});
}

TEST_F(NpzCli, LayerGivesTheBytesOfTheNpyRun) {
  expect_same_outputs({"layer", "--x", "@x", "--wq", "@wq", "--wk", "@wk", "--wv", "@wv", "--wo",
                       "@wo", "--heads", "2", "--causal", "--out", "o.npy"},
                      {"o.npy"});
}

TEST_F(NpzCli, ExplainGivesTheSvgOfTheNpyRun) {
  expect_same_outputs(
      {"explain", "--q", "@q", "--k", "@k", "--v", "@v", "--quiet", "--svg", "h.svg"}, {"h.svg"});
}

TEST_F(NpzCli, AMemberOverTheBudgetIsRefusedFromItsHeader) {
  // 2 MiB of float32 zeros, deflated to a few KiB: within deflate's ratio, over a 1 MiB budget.
  const Tensor zeros(DType::kF32, {512, 1024}, "z");
  testing::write_npz(dir_ / "big.npz", {{"q.npy", encode_npy(zeros.view(), DType::kF32), true}});
  ASSERT_LT(fs::file_size(dir_ / "big.npz"), 64u * 1024);
  expect_refused({"attention", "--q", "big.npz:q", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy",
                  "--max-memory", "1M"},
                 "--max-memory: the inputs alone take 2098048 bytes (2 MiB)");
}

TEST_F(NpzCli, HostileArchivesInEveryPositionAreOneLineAndNoOutput) {
  const fs::path corpus = fs::path(QKV_HOSTILE_DIR) / "npz";
  for (const char* file : {"bomb_claims_4gib", "bad_crc_deflated", "duplicate_names", "name_dotdot",
                           "bomb_inflates_past_declared_size"}) {
    const std::string spec = (corpus / (std::string(file) + ".npz")).string() + ":q";
    SCOPED_TRACE(spec);
    expect_refused({"attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--mask", spec,
                    "--out", "o.npy"},
                   file);
    expect_refused({"layer", "--x", "x.npy", "--wq", "wq.npy", "--wk", spec, "--wv", "wv.npy",
                    "--heads", "2", "--out", "o.npy"},
                   file);
    expect_refused(
        {"explain", "--q", "q.npy", "--k", spec, "--v", "v.npy", "--quiet", "--svg", "h.svg"},
        file);
  }
  expect_refused({"attention", "--q", "s.npz", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"},
                 "s.npz: is an .npz archive: name the array as s.npz:NAME");
  expect_refused(
      {"attention", "--q", "s.npz:nope", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"},
      "s.npz: has no array named 'nope'; the archive holds 9 arrays: 'k', 'm', 'q', "
      "'v', ...");
}

}  // namespace
}  // namespace qkv
