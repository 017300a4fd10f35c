// End-to-end tests of what the qkv executable does with the paths it is given: inputs that are
// not regular files are refused without blocking, outputs that are not regular files are never
// replaced, symbolic links to outputs stay links, one file given as two outputs is refused
// however it is spelled, and a command that fails leaves every existing output as it was.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/refusal.h"
#include "support/test_support.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

using testing::CommandRun;
using testing::files_in;
using testing::slurp;

// Long enough for a loaded machine; a run that blocks is killed then and fails the test.
constexpr int kTimeoutSeconds = 30;

// A Unix socket bound at `path` (its descriptor), or -1.
int bind_socket(const fs::path& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.native().size() >= sizeof address.sun_path) return -1;
  std::memcpy(address.sun_path, path.c_str(), path.native().size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd >= 0 && bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

class CliFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const Tensor t = testing::random_tensor(DType::kF32, {4, 8}, 1);
    for (const char* name : {"q.npy", "k.npy", "v.npy"}) {
      write_npy(dir_ / name, t.view(), DType::kF32);
    }
  }

  CommandRun run(const std::vector<std::string>& args) {
    return testing::run_program(QKV_CLI_PATH, dir_.path(), args, kTimeoutSeconds);
  }

  // The refusal every bad input gets (support/refusal.h).
  void expect_refused(const std::vector<std::string>& args, const std::string& mentions) {
    testing::expect_refused(QKV_CLI_PATH, dir_.path(), args, mentions, {}, kTimeoutSeconds);
  }

  std::vector<std::string> attention(const std::string& q, const std::string& out) {
    return {"attention", "--q", q, "--k", "k.npy", "--v", "v.npy", "--out", out};
  }

  testing::ScratchDir dir_;
};

TEST_F(CliFiles, FifoInputIsRefusedWithoutBlocking) {
  ASSERT_EQ(mkfifo((dir_ / "fifo.npy").c_str(), 0600), 0);
  expect_refused(attention("fifo.npy", "o.npy"),
                 "fifo.npy: cannot read: not a regular file (a FIFO)");
  ASSERT_EQ(mkfifo((dir_ / "w.safetensors").c_str(), 0600), 0);
  expect_refused(attention("w.safetensors:q", "o.npy"),
                 "w.safetensors: cannot read: not a regular file (a FIFO)");
  std::vector<std::string> masked = attention("q.npy", "o.npy");
  masked.insert(masked.end(), {"--mask", "fifo.npy"});
  expect_refused(masked, "fifo.npy: cannot read: not a regular file (a FIFO)");
}

TEST_F(CliFiles, DeviceAndPipeInputsAreRefused) {
  expect_refused(attention("/dev/null", "o.npy"),
                 "/dev/null: cannot read: not a regular file (a character device)");
  expect_refused(attention("/dev/zero", "o.npy"),
                 "/dev/zero: cannot read: not a regular file (a character device)");
  // A pipe the command inherits, named through /proc.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const std::string proc = "/proc/self/fd/" + std::to_string(fds[0]);
  expect_refused(attention(proc, "o.npy"), proc + ": cannot read: not a regular file (a FIFO)");
  close(fds[0]);
  close(fds[1]);
  // A socket cannot even be opened (ENXIO): it is named for what it is.
  const int socket_fd = bind_socket(dir_ / "sock.npy");
  ASSERT_GE(socket_fd, 0);
  expect_refused(attention("sock.npy", "o.npy"),
                 "sock.npy: cannot read: not a regular file (a socket)");
  expect_refused(attention("q.npy", "sock.npy"),
                 "sock.npy: is not a regular file (a socket); refusing to replace it");
  close(socket_fd);
}

// A second output whose name is too long for its folder (its temporary name, shortened, is
// not): the command fails before the first output, which exists, is replaced.
TEST_F(CliFiles, AnUnwritableLaterOutputLeavesTheEarlierOneAlone) {
  write_npy(dir_ / "o.npy", testing::random_tensor(DType::kF32, {2}, 9).view(), DType::kF32);
  const std::string before = slurp(dir_ / "o.npy");
  const std::string long_name(300, 'l');
  std::vector<std::string> args = attention("q.npy", "o.npy");
  args.insert(args.end(), {"--lse", long_name});
  expect_refused(args, long_name + ": cannot write: File name too long");
  EXPECT_EQ(slurp(dir_ / "o.npy"), before);
}

TEST_F(CliFiles, NonRegularOutputsAreNeverReplaced) {
  ASSERT_EQ(mkfifo((dir_ / "fifo.npy").c_str(), 0600), 0);
  expect_refused(attention("q.npy", "fifo.npy"),
                 "fifo.npy: is not a regular file (a FIFO); refusing to replace it");
  EXPECT_TRUE(fs::is_fifo(dir_ / "fifo.npy"));
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const std::string proc = "/proc/self/fd/" + std::to_string(fds[1]);
  expect_refused(attention("q.npy", proc), proc + ": is not a regular file (a FIFO)");
  close(fds[0]);
  close(fds[1]);
  // A device node of our own (root only), standing in for /dev/null.
  if (mknod((dir_ / "null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) {
    expect_refused(attention("q.npy", "null"),
                   "null: is not a regular file (a character device); refusing to replace it");
    EXPECT_TRUE(fs::is_character_file(dir_ / "null"));
  }
}

// The report's case itself. Before the fix this replaced /dev/null when run as root (the test
// above checks the same refusal on a device node of its own, which is safe to lose).
TEST_F(CliFiles, DevNullIsNeverReplaced) {
  expect_refused(attention("q.npy", "/dev/null"),
                 "/dev/null: is not a regular file (a character device); refusing to replace it");
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
}

TEST_F(CliFiles, ASymlinkedOutputStaysASymlink) {
  fs::create_directory(dir_ / "real");
  write_npy(dir_ / "real" / "o.npy", testing::random_tensor(DType::kF32, {2}, 9).view(),
            DType::kF32);
  fs::create_symlink("real/o.npy", dir_ / "o.npy");
  const CommandRun r = run(attention("q.npy", "o.npy"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(dir_ / "o.npy"));
  EXPECT_EQ(read_npy(dir_ / "real" / "o.npy").shape(), (Shape{4, 8}));
  fs::create_symlink("real/missing.npy", dir_ / "dangling.npy");
  expect_refused(attention("q.npy", "dangling.npy"),
                 "dangling.npy: is a symbolic link to a missing file");
}

TEST_F(CliFiles, OneFileGivenAsTwoOutputsIsRefusedHoweverItIsSpelled) {
  fs::create_directory_symlink(".", dir_ / "here");
  const std::string absolute = (dir_ / "o.npy").string();
  for (const std::string& other : {absolute, std::string("here/o.npy")}) {
    std::vector<std::string> args = attention("q.npy", "o.npy");
    args.insert(args.end(), {"--lse", other});
    expect_refused(args, other + ": is given as more than one output");
  }
}

}  // namespace
}  // namespace qkv
