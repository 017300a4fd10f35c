// OutputFiles and write_npy: outputs appear together on commit, and a set that is never
// committed leaves the file system as it found it.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

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

// ---- Every foreseeable failure is found while staging; a commit is all or nothing. ----

// A final name above NAME_MAX, whose temporary name (shortened) can be created: refused by
// stage(), before an earlier output of the set is replaced.
TEST(OutputFiles, NameTooLongForItsFolderIsRefusedWhileStaging) {
  ScratchDir dir;
  write_file(dir / "a.bin", "old a");
  const std::string long_name(300, 'l');
  std::string problem;
  bool staged = false;
  try {
    OutputFiles files;
    files.stage(dir / "a.bin", bytes_of("new a"));
    files.stage(dir / long_name, bytes_of("new l"));
    staged = true;
    files.commit();
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), (dir / long_name).string());
    problem = e.problem();
  }
  EXPECT_FALSE(staged);
  EXPECT_NE(problem.find("File name too long"), std::string::npos) << problem;
  EXPECT_EQ(read_file(dir / "a.bin"), "old a");
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"a.bin"});
}

// A rename that fails at commit all the same (here the temporary file of the third output is
// removed behind qkv's back): the outputs already renamed are put back as they were.
TEST(OutputFiles, AFailedRenameRollsBackTheOutputsAlreadyReplaced) {
  ScratchDir dir;
  write_file(dir / "a.bin", "old a");
  OutputFiles files;
  files.stage(dir / "a.bin", bytes_of("new a"));
  files.stage(dir / "b.bin", bytes_of("new b"));
  files.stage(dir / "c.bin", bytes_of("new c"));
  for (const auto& name : names_in(dir.path())) {
    if (name.starts_with(".c.bin.qkv-tmp-")) std::filesystem::remove(dir / name);
  }
  try {
    files.commit();
    ADD_FAILURE() << "commit succeeded without a temporary file";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), (dir / "c.bin").string());
    EXPECT_NE(e.problem().find("No such file or directory"), std::string::npos) << e.problem();
    EXPECT_NE(e.problem().find("left as they were"), std::string::npos) << e.problem();
  }
  EXPECT_EQ(read_file(dir / "a.bin"), "old a");
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"a.bin"});
}

// ---- Destinations that are not regular files, and symbolic links. ----

void expect_stage_refused(const std::filesystem::path& path, const std::string& phrase) {
  OutputFiles files;
  try {
    files.stage(path, bytes_of("x"));
    ADD_FAILURE() << path << " was staged";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), path.string());
    EXPECT_NE(e.problem().find(phrase), std::string::npos) << e.problem();
  }
}

TEST(OutputFiles, NonRegularDestinationsAreRefused) {
  ScratchDir dir;
  ASSERT_EQ(mkfifo((dir / "fifo.npy").c_str(), 0600), 0);
  expect_stage_refused(dir / "fifo.npy", "is not a regular file (a FIFO); refusing to replace it");
  EXPECT_TRUE(std::filesystem::is_fifo(dir / "fifo.npy"));
  // Staging only (a commit before the fix would have replaced /dev/null when run as root).
  expect_stage_refused("/dev/null", "is not a regular file (a character device); refusing");
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  expect_stage_refused("/proc/self/fd/" + std::to_string(fds[1]), "is not a regular file (a FIFO)");
  close(fds[0]);
  close(fds[1]);
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"fifo.npy"});
}

TEST(OutputFiles, ASymlinkIsWrittenThroughToItsTarget) {
  ScratchDir dir;
  std::filesystem::create_directory(dir / "real");
  write_file(dir / "real" / "target.bin", "old");
  std::filesystem::create_symlink("real/target.bin", dir / "link.bin");
  OutputFiles files;
  files.stage(dir / "link.bin", bytes_of("new"));
  files.commit();
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "link.bin"));
  EXPECT_EQ(read_file(dir / "real" / "target.bin"), "new");
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"link.bin", "real"}));
  EXPECT_EQ(names_in(dir / "real"), std::vector<std::string>{"target.bin"});
}

TEST(OutputFiles, ADanglingSymlinkIsRefused) {
  ScratchDir dir;
  std::filesystem::create_symlink("missing.bin", dir / "link.bin");
  expect_stage_refused(dir / "link.bin", "is a symbolic link to a missing file");
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"link.bin"});
}

// ---- One file given as two outputs, however it is spelled. ----

TEST(OutputFiles, SameDestinationUnderAnySpellingThrows) {
  ScratchDir dir;
  std::filesystem::create_directory(dir / "sub");
  std::filesystem::create_directory_symlink(".", dir / "alias");
  std::filesystem::create_symlink("o.bin", dir / "link.bin");
  const auto previous = std::filesystem::current_path();
  std::filesystem::current_path(dir / "sub");
  for (const bool exists : {false, true}) {
    if (exists) write_file(dir / "o.bin", "old");
    const std::vector<std::filesystem::path> spellings = {
        "../o.bin", dir / "sub" / ".." / "o.bin", dir / "alias" / "o.bin",
        dir / "alias" / "alias" / "sub" / ".." / "o.bin"};
    for (const auto& other : spellings) {
      SCOPED_TRACE(other.string() + (exists ? " (exists)" : ""));
      OutputFiles files;
      files.stage(dir / "o.bin", bytes_of("first"));
      try {
        files.stage(other, bytes_of("second"));
        ADD_FAILURE() << "the same destination was staged twice";
      } catch (const Error& e) {
        EXPECT_EQ(e.subject(), other.string());
        EXPECT_NE(e.problem().find("more than one output"), std::string::npos) << e.problem();
      }
    }
    if (exists) {
      // Through a symbolic link to the other output (which must exist to be written through).
      OutputFiles files;
      files.stage(dir / "o.bin", bytes_of("first"));
      EXPECT_THROW(files.stage(dir / "link.bin", bytes_of("second")), Error);
      files.commit();
      EXPECT_EQ(read_file(dir / "o.bin"), "first");
    }
  }
  std::filesystem::current_path(previous);
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
