// OutputFiles and write_npy: outputs appear together on commit, and a set that is never
// committed leaves the file system as it found it.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/tensor.h"
#include "support/test_support.h"

namespace qkv {
namespace {

using testing::ScratchDir;

std::vector<char> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The names in a folder, sorted, including hidden ones (where temporary files would be).
std::vector<std::string> names_in(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool is_temp_name(const std::string& name) {
  return name.front() == '.' && name.find(".qkv-tmp-") != std::string::npos;
}

TEST(OutputFiles, CommitMakesEveryFileAppear) {
  ScratchDir dir;
  std::filesystem::create_directory(dir / "sub");
  OutputFiles files;
  files.stage(dir / "a.bin", bytes_of("alpha"));
  files.stage(dir / "sub" / "b.bin", bytes_of(""));
  const Tensor t = testing::random_tensor(DType::kF32, {2, 3}, 7);
  files.stage_npy(dir / "c.npy", t.view(), DType::kF64);

  // Staged but not committed: only hidden temporary files beside the destinations.
  for (const auto& name : names_in(dir.path())) {
    if (name != "sub") {
      EXPECT_TRUE(is_temp_name(name)) << name;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "a.bin"));

  files.commit();
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"a.bin", "c.npy", "sub"}));
  EXPECT_EQ(names_in(dir / "sub"), (std::vector<std::string>{"b.bin"}));
  EXPECT_EQ(read_file(dir / "a.bin"), "alpha");
  EXPECT_EQ(read_file(dir / "sub" / "b.bin"), "");
  const Tensor back = read_npy(dir / "c.npy");
  EXPECT_EQ(back.dtype(), DType::kF64);
  EXPECT_EQ(testing::max_abs_diff(back.view(), t.view()), 0.0);
}

TEST(OutputFiles, UncommittedSetLeavesNoFile) {
  ScratchDir dir;
  {
    OutputFiles files;
    files.stage(dir / "a.bin", bytes_of("alpha"));
    files.stage(dir / "b.bin", bytes_of("beta"));
    EXPECT_EQ(names_in(dir.path()).size(), 2u);
  }
  EXPECT_TRUE(names_in(dir.path()).empty());
}

TEST(OutputFiles, UncommittedSetLeavesExistingOutputsByteIdentical) {
  ScratchDir dir;
  const std::string original("old contents\0\xff", 15);
  write_file(dir / "out.npy", original);
  {
    OutputFiles files;
    files.stage(dir / "out.npy", bytes_of("new contents"));
    EXPECT_EQ(read_file(dir / "out.npy"), original);
  }
  EXPECT_EQ(read_file(dir / "out.npy"), original);
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"out.npy"});
}

TEST(OutputFiles, CommitReplacesExistingOutputs) {
  ScratchDir dir;
  write_file(dir / "out.bin", "a much longer old file that must not leave a tail");
  OutputFiles files;
  files.stage(dir / "out.bin", bytes_of("new"));
  files.commit();
  EXPECT_EQ(read_file(dir / "out.bin"), "new");
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"out.bin"});
}

TEST(OutputFiles, StageIntoMissingDirectoryThrowsNamingThePath) {
  ScratchDir dir;
  const auto path = dir / "no" / "such" / "out.npy";
  {
    OutputFiles files;
    files.stage(dir / "fine.bin", bytes_of("x"));
    try {
      files.stage(path, bytes_of("y"));
      ADD_FAILURE() << "stage into a missing directory succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.subject(), path.string());
      EXPECT_NE(e.problem().find("No such file or directory"), std::string::npos) << e.problem();
    }
  }
  // The failure leaves nothing behind, not even the other staged file's temporary.
  EXPECT_TRUE(names_in(dir.path()).empty());
}

TEST(OutputFiles, StageOntoADirectoryThrows) {
  ScratchDir dir;
  std::filesystem::create_directory(dir / "taken");
  OutputFiles files;
  try {
    files.stage(dir / "taken", bytes_of("x"));
    ADD_FAILURE() << "stage onto a directory succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), (dir / "taken").string());
    EXPECT_NE(e.problem().find("Is a directory"), std::string::npos) << e.problem();
  }
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"taken"});
}

TEST(OutputFiles, SameDestinationTwiceThrows) {
  ScratchDir dir;
  OutputFiles files;
  files.stage(dir / "out.bin", bytes_of("x"));
  try {
    files.stage(dir / "." / "out.bin", bytes_of("y"));
    ADD_FAILURE() << "the same destination was staged twice";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), (dir / "." / "out.bin").string());
    EXPECT_NE(e.problem().find("more than one output"), std::string::npos) << e.problem();
  }
  files.commit();
  EXPECT_EQ(read_file(dir / "out.bin"), "x");
}

// A write that fails part way (here the file size limit, standing in for a full disk) must
// throw naming the destination and remove the partial temporary file.
TEST(OutputFiles, FailedWriteRemovesTheTemporaryFile) {
  ScratchDir dir;
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 1000;
  // Without this, exceeding the limit kills the process instead of failing the write.
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string problem;
  try {
    OutputFiles files;
    files.stage(dir / "big.bin", std::vector<char>(100000, 'x'));
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), (dir / "big.bin").string());
    problem = e.problem();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous_handler);
  EXPECT_NE(problem.find("cannot write: File too large"), std::string::npos) << problem;
  EXPECT_TRUE(names_in(dir.path()).empty());
}

// The renamed output has the permissions a plain write would give it (0666 less the umask),
// not mkstemp's 0600.
TEST(OutputFiles, PermissionsFollowTheUmask) {
  ScratchDir dir;
  const mode_t mask = umask(022);
  write_npy(dir / "out.npy", Tensor(DType::kF32, {1}, "t").view(), DType::kF32);
  umask(mask);
  struct stat info {};
  ASSERT_EQ(stat((dir / "out.npy").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0644u);
}

TEST(OutputFiles, RelativeDestination) {
  ScratchDir dir;
  const auto previous = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  {
    OutputFiles files;
    files.stage("relative.bin", bytes_of("r"));
    files.commit();
  }
  std::filesystem::current_path(previous);
  EXPECT_EQ(read_file(dir / "relative.bin"), "r");
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"relative.bin"});
}

TEST(OutputFiles, FailedRenameNamesTheDestination) {
  ScratchDir dir;
  OutputFiles files;
  files.stage(dir / "out.bin", bytes_of("x"));
  // Something outside qkv removes the temporary file before commit.
  for (const auto& name : names_in(dir.path())) std::filesystem::remove(dir / name);
  try {
    files.commit();
    ADD_FAILURE() << "commit succeeded without its temporary file";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), (dir / "out.bin").string());
    EXPECT_NE(e.problem().find("No such file or directory"), std::string::npos) << e.problem();
  }
}

TEST(WriteNpy, WritesAndReplaces) {
  ScratchDir dir;
  const auto path = dir / "o.npy";
  write_npy(path, testing::random_tensor(DType::kF32, {4}, 1).view(), DType::kF32);
  const Tensor second = testing::random_tensor(DType::kF64, {2, 2}, 2);
  write_npy(path, second.view(), DType::kF64);
  const Tensor back = read_npy(path);
  EXPECT_EQ(back.shape(), Shape({2, 2}));
  EXPECT_EQ(testing::max_abs_diff(back.view(), second.view()), 0.0);
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"o.npy"});
}

}  // namespace
}  // namespace qkv
