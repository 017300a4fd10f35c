// The messages of the command line, word for word: a usage error is one stderr line
// "qkv COMMAND: PROBLEM (see 'qkv COMMAND --help')" with exit status 2 for every command (bench
// included), --threads is checked alike everywhere, a misspelt option is named as unknown, and a
// non-finite input element is named by its NumPy index. No failed command creates a file.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

using testing::CommandRun;
using testing::files_in;

class CliMessages : public ::testing::Test {
 protected:
  void SetUp() override {
    save("q.npy", testing::random_tensor(DType::kF32, {5, 8}, 1));
    save("k.npy", testing::random_tensor(DType::kF32, {6, 8}, 2));
    save("v.npy", testing::random_tensor(DType::kF32, {6, 3}, 3));
    save("x.npy", testing::random_tensor(DType::kF32, {5, 8}, 4));
    save("w.npy", testing::random_tensor(DType::kF32, {8, 8}, 5));
  }

  void save(const std::string& name, const Tensor& t) {
    write_npy(dir_.path() / name, t.view(), t.dtype());
  }

  // Runs qkv with `args` and expects it to fail with `status`, the exact stderr line `line`,
  // nothing on stdout and no file created or removed.
  void expect_message(const std::vector<std::string>& args, int status, const std::string& line) {
    std::string shown;
    for (const std::string& a : args) shown += a + " ";
    SCOPED_TRACE(shown);
    const std::vector<std::string> before = files_in(dir_.path());
    const CommandRun run = testing::run_program(QKV_CLI_PATH, dir_.path(), args, 60);
    EXPECT_EQ(run.status, status) << run.err;
    EXPECT_EQ(run.err, line + "\n");
    EXPECT_EQ(run.out, "");
    EXPECT_EQ(files_in(dir_.path()), before);
  }

  // The usage error of `command`: exit status 2 and a line pointing at its help.
  void expect_usage(const std::vector<std::string>& args, const std::string& problem) {
    const std::string command = "qkv " + args.front();
    expect_message(args, 2, command + ": " + problem + " (see '" + command + " --help')");
  }

  testing::ScratchDir dir_;
};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// Complete command lines of every command, to which one bad flag is added.
const std::vector<std::vector<std::string>>& every_command() {
  static const std::vector<std::vector<std::string>> commands = {
      {"attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"},
      {"layer", "--x", "x.npy", "--wq", "w.npy", "--wk", "w.npy", "--wv", "w.npy", "--heads", "2",
       "--out", "o.npy"},
      {"explain", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--svg", "o.svg"},
      {"bench", "--n", "8", "--d", "8", "--heads", "1", "--repeats", "1", "--no-baseline"},
      {"decode", "--tokens", "1", "--heads", "1", "--d", "8"},
  };
  return commands;
}

TEST_F(CliMessages, ThreadsIsCheckedAlikeByEveryCommand) {
  for (const std::vector<std::string>& command : every_command()) {
    expect_usage(with(command, {"--threads", "-2"}),
                 "--threads: must be 0 (all cores) or more, got -2");
    expect_usage(with(command, {"--threads", "two"}),
                 "--threads: must be a whole number, 0 (all cores) or more, got 'two'");
    expect_usage(with(command, {"--threads", "99999999999"}),
                 "--threads: must be at most 2147483647, got 99999999999");
    expect_usage(with(command, {"--threads", "-99999999999999999999999"}),
                 "--threads: must be 0 (all cores) or more, got -99999999999999999999999");
  }
}

TEST_F(CliMessages, AMisspeltOptionIsNamedAsUnknownNotAsAMissingOne) {
  expect_usage({"attention", "--Q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"},
               "unknown option --Q; did you mean --q?");
  expect_usage({"attention", "-q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"},
               "unknown option -q; did you mean --q?");
  expect_usage({"attention", "--Q=q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"},
               "unknown option --Q; did you mean --q?");
  expect_usage({"layer", "--X", "x.npy", "--wq", "w.npy", "--wk", "w.npy", "--wv", "w.npy",
                "--heads", "2", "--out", "o.npy"},
               "unknown option --X; did you mean --x?");
  expect_usage({"explain", "--rowz", "1"}, "unknown option --rowz; did you mean --row?");
  expect_usage({"bench", "--N", "8", "--d", "8", "--heads", "1"},
               "unknown option --N; did you mean --n?");
  expect_usage({"decode", "--token", "1"}, "unknown option --token; did you mean --tokens?");
  // Also among correct flags, and a stray word.
  for (const std::vector<std::string>& command : every_command()) {
    expect_usage(with(command, {"--frobnicate"}), "unknown option --frobnicate");
  }
  expect_usage(
      {"attention", "--q", "q.npy", "stray", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"},
      "unexpected argument 'stray'");
  expect_message({"--frobnicate"}, 2, "qkv: unknown option --frobnicate (see 'qkv --help')");
}

TEST_F(CliMessages, UsageErrorsNameTheCommandAndPointAtItsHelp) {
  expect_usage({"attention", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"}, "--q is required");
  expect_usage({"layer", "--x", "x.npy", "--wq", "w.npy", "--wk", "w.npy", "--wv", "w.npy", "--out",
                "o.npy"},
               "--heads is required");
  expect_usage({"layer", "--x", "x.npy", "--wq", "w.npy", "--wk", "w.npy", "--wv", "w.npy",
                "--heads", "-1", "--out", "o.npy"},
               "--heads: must be an integer >= 1, got '-1'");
  expect_usage({"explain", "--head", "-1"}, "--head: must be an integer >= 0, got '-1'");
  expect_usage({"explain", "--top", "0"}, "--top: must be an integer >= 1, got '0'");
  expect_usage({"decode", "--tokens", "-1"}, "--tokens: must be an integer >= 0, got '-1'");
}

TEST_F(CliMessages, BenchFollowsTheSameRules) {
  // Required flags: exit status 2, like the parser's own; marked in the help.
  expect_usage({"bench"}, "--n is required, unless --peak or --decode");
  expect_usage({"bench", "--n", "8", "--heads", "2"}, "--d is required, unless --peak");
  expect_usage({"bench", "--n", "8", "--d", "8"}, "--heads is required, unless --peak");
  expect_usage({"bench", "--n", "0", "--d", "8", "--heads", "2"},
               "--n: must be an integer >= 1, got '0'");
  expect_usage({"bench", "--n", "8", "--d", "8", "--heads", "3", "--kv-heads", "2"},
               "--kv-heads: 2 does not divide --heads 3");
  expect_usage({"bench", "--n", "8", "--d", "8", "--heads", "2", "--repeats", "-1"},
               "--repeats: must be an integer >= 0, got '-1'");
  const CommandRun help = testing::run_program(QKV_CLI_PATH, dir_.path(), {"bench", "--help"}, 60);
  EXPECT_EQ(help.status, 0);
  for (const char* flag : {"--n", "--d", "--heads"}) {
    const std::size_t at = help.out.find(std::string("  ") + flag + " ");
    ASSERT_NE(at, std::string::npos) << flag;
    // The option's entry, to the next option (CLI11 may wrap it onto a second line).
    const std::string entry = help.out.substr(at, help.out.find("\n  --", at) - at);
    EXPECT_NE(entry.find("REQUIRED"), std::string::npos) << entry;
  }
}

TEST_F(CliMessages, ANonFiniteInputIsNamedByItsNumpyIndex) {
  // 2-D: Q [5, 8], NaN at [2, 3].
  Tensor q = testing::random_tensor(DType::kF32, {5, 8}, 1);
  q.data_as<float>()[2 * 8 + 3] = std::numeric_limits<float>::quiet_NaN();
  save("q_nan.npy", q);
  expect_message(
      {"attention", "--q", "q_nan.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"}, 1,
      "q_nan.npy: holds NaN at [2, 3] (inputs must be finite)");
  // 4-D: K [2, 3, 6, 8], an infinity at [1, 2, 4, 5].
  save("q4.npy", testing::random_tensor(DType::kF32, {2, 3, 5, 8}, 6));
  save("v4.npy", testing::random_tensor(DType::kF32, {2, 3, 6, 4}, 7));
  Tensor k = testing::random_tensor(DType::kF64, {2, 3, 6, 8}, 8);
  k.data_as<double>()[((1 * 3 + 2) * 6 + 4) * 8 + 5] = -std::numeric_limits<double>::infinity();
  save("k_inf.npy", k);
  expect_message(
      {"attention", "--q", "q4.npy", "--k", "k_inf.npy", "--v", "v4.npy", "--out", "o.npy"}, 1,
      "k_inf.npy: holds an infinity at [1, 2, 4, 5] (inputs must be finite)");
  // A float mask [5, 6] with NaN at [4, 1].
  Tensor mask = testing::random_tensor(DType::kF32, {5, 6}, 9);
  mask.data_as<float>()[4 * 6 + 1] = std::numeric_limits<float>::quiet_NaN();
  save("m.npy", mask);
  expect_message({"attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--mask", "m.npy",
                  "--out", "o.npy"},
                 1,
                 "m.npy: float mask holds NaN at [4, 1] (only finite values and -inf are allowed)");
}

}  // namespace
}  // namespace qkv
