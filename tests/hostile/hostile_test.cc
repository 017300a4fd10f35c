// The committed hostile corpus (make_corpus.py, make_npz_corpus.py): every .npy, .safetensors
// and .npz file in npy/, safetensors/ and npz/, given to `qkv attention` as Q (FILE:q for the
// archives), must end the command with exit status 1, exactly
// one stderr line that names the file, and no output file; every file in legal/ must be accepted.
// Under the asan preset the same run is AddressSanitizer- and UBSan-checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> corpus(const char* folder) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(fs::path(QKV_HOSTILE_DIR) / folder)) {
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<fs::path> whole_corpus() {
  std::vector<fs::path> files = corpus("npy");
  for (const char* folder : {"safetensors", "npz"}) {
    const std::vector<fs::path> more = corpus(folder);
    files.insert(files.end(), more.begin(), more.end());
  }
  return files;
}

class HostileFile : public ::testing::TestWithParam<fs::path> {};

TEST_P(HostileFile, IsRefusedWithOneLineNamingItAndNoOutput) {
  const fs::path file = GetParam();
  const bool named = file.parent_path().filename() != "npy";  // FILE.safetensors:q, FILE.npz:q
  testing::ScratchDir dir;
  const Tensor kv = testing::random_tensor(DType::kF32, {8, 4}, 1);
  write_npy(dir / "k.npy", kv.view(), DType::kF32);
  write_npy(dir / "v.npy", kv.view(), DType::kF32);
  const std::vector<std::string> before = testing::files_in(dir.path());
  const std::string spec = file.string() + (named ? ":q" : "");
  const testing::CommandRun run =
      testing::run_program(QKV_CLI_PATH, dir.path(),
                           {"attention", "--q", spec, "--k", "k.npy", "--v", "v.npy", "--out",
                            "o.npy", "--weights", "w.npy"});
  EXPECT_EQ(run.status, 1) << run.err;
  ASSERT_FALSE(run.err.empty());
  EXPECT_EQ(run.err.back(), '\n');
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_NE(run.err.find(file.filename().string()), std::string::npos) << run.err;
  EXPECT_TRUE(run.out.empty()) << run.out;
  EXPECT_EQ(testing::files_in(dir.path()), before) << run.err;
}

INSTANTIATE_TEST_SUITE_P(Corpus, HostileFile, ::testing::ValuesIn(whole_corpus()),
                         [](const auto& param_info) {
                           std::string name = param_info.param.parent_path().filename().string() +
                                              "_" + param_info.param.filename().string();
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

// The legal edge cases (legal/): float16 and bfloat16 extremes (subnormals, the largest finite
// values, -0), other .npy versions, zero rows, tensors after others in a safetensors file,
// archives from np.savez and np.savez_compressed. Each is accepted as Q, and the output has its
// rows.
class LegalFile : public ::testing::TestWithParam<fs::path> {};

TEST_P(LegalFile, IsAcceptedAndGivesAnOutputOfItsRows) {
  const fs::path file = GetParam();
  const bool named = file.extension() == ".safetensors" || file.extension() == ".npz";
  const TensorInfo info = inspect_tensor(file.string() + (named ? ":q" : ""));
  ASSERT_EQ(info.shape.size(), 2u);
  testing::ScratchDir dir;
  const Tensor kv = testing::random_tensor(DType::kF32, {8, 4}, 1);
  write_npy(dir / "k.npy", kv.view(), DType::kF32);
  write_npy(dir / "v.npy", kv.view(), DType::kF32);
  const std::string spec = file.string() + (named ? ":q" : "");
  const testing::CommandRun run = testing::run_program(
      QKV_CLI_PATH, dir.path(),
      {"attention", "--q", spec, "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_TRUE(run.err.empty()) << run.err;
  const Tensor out = read_npy(dir / "o.npy");
  EXPECT_EQ(out.shape(), (Shape{info.shape[0], 4}));
  for (std::int64_t e = 0; e < out.numel(); ++e) {
    EXPECT_TRUE(std::isfinite(testing::element(out.view(), e))) << e;
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, LegalFile, ::testing::ValuesIn(corpus("legal")),
                         [](const auto& param_info) {
                           std::string name = param_info.param.filename().string();
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

TEST(HostileCorpus, HasAtLeastThirtyNpyAndTwentyFiveSafetensorsAndThirtyNpzFiles) {
  EXPECT_GE(corpus("npy").size(), 30u);
  EXPECT_GE(corpus("safetensors").size(), 25u);
  EXPECT_GE(corpus("npz").size(), 30u);
}

}  // namespace
}  // namespace qkv
