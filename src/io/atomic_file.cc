// Output files that appear whole or not at all.
//
// Each output is written to a temporary file in its destination's directory (the same file
// system, so rename(2) can move it into place atomically), flushed to disk, and renamed over
// the destination only when every output of the command has been written. Until then the
// destination keeps whatever it held; a reader never sees a partial file.
//
// Committing several files is a sequence of renames, not one atomic step: the checks that can
// fail (the directory exists and is writable, the destination is not a directory) are made
// when staging, so a rename that fails at commit time means the file system changed under us.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <random>
#include <set>
#include <string>
#include <system_error>
#include <utility>

#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv {

// One staged output. `temp` is empty once it has been renamed into place (or removed), so the
// list of staged files is also the one list of temporary files that may need removing — the
// place a future signal handler will look.
struct OutputFiles::Staged {
  std::filesystem::path destination;
  std::filesystem::path temp;
};

namespace {

// Long destination names are shortened in the temporary name so that it stays within
// NAME_MAX (255 bytes on common file systems) after the prefix and suffix are added.
constexpr std::size_t kMaxNameInTemp = 128;
constexpr int kTempAttempts = 100;

std::string errno_message(int err) {
  return std::error_code(err, std::generic_category()).message();
}

std::string random_suffix() {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<std::size_t> pick(0, sizeof kChars - 2);
  std::string suffix(6, ' ');
  for (char& c : suffix) c = kChars[pick(rng)];
  return suffix;
}

// Creates ".<name>.qkv-tmp-XXXXXX" beside `destination` and returns its descriptor and path.
// Unlike mkstemp, which makes the file 0600, this creates it 0666 less the umask, so that the
// renamed output has the permissions a plain write would have given it.
std::pair<int, std::filesystem::path> create_temp(const std::filesystem::path& destination,
                                                  const std::string& subject) {
  std::string name = destination.filename().string();
  if (name.size() > kMaxNameInTemp) name.resize(kMaxNameInTemp);
  const std::filesystem::path directory = destination.parent_path();
  for (int attempt = 0; attempt < kTempAttempts; ++attempt) {
    std::filesystem::path temp = directory / ("." + name + ".qkv-tmp-" + random_suffix());
    int fd;
    do {
      fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    } while (fd < 0 && errno == EINTR);
    if (fd >= 0) return {fd, std::move(temp)};
    if (errno != EEXIST) {
      throw Error(subject,
                  "cannot create a temporary file in its directory: " + errno_message(errno));
    }
  }
  throw Error(subject, "cannot create a temporary file in its directory: every name tried exists");
}

// Writes all of `bytes`, flushes them to disk and closes `fd`; returns 0 or the errno of the
// first failure. The descriptor is closed on every path.
int write_sync_close(int fd, const std::vector<char>& bytes) {
  int err = 0;
  const char* data = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0 && err == 0) {
    const ssize_t wrote = ::write(fd, data, left);
    if (wrote < 0) {
      if (errno != EINTR) err = errno;
      continue;
    }
    data += wrote;
    left -= static_cast<std::size_t>(wrote);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  // Some file systems (NFS) report a failed write only at close.
  if (::close(fd) != 0 && err == 0 && errno != EINTR) err = errno;
  return err;
}

// Makes the renames themselves durable. Best effort: the data is already safe, and a failure
// here cannot be undone or usefully reported.
void sync_directory(const std::filesystem::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

OutputFiles::OutputFiles() = default;

OutputFiles::~OutputFiles() {
  for (const Staged& staged : staged_) {
    if (!staged.temp.empty()) ::unlink(staged.temp.c_str());
  }
}

void OutputFiles::stage(const std::filesystem::path& path, const std::vector<char>& bytes) {
  const std::string subject = path.string();
  if (!path.has_filename()) throw Error(subject, "is not a file name");
  for (const Staged& staged : staged_) {
    if (!staged.temp.empty() && staged.destination.lexically_normal() == path.lexically_normal()) {
      throw Error(subject, "is given as more than one output");
    }
  }
  // Caught now rather than at commit, when other outputs may already have been renamed.
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    throw Error(subject, "cannot write: " + errno_message(EISDIR));
  }

  // Reserved first: once the temporary file exists, recording it must not fail.
  staged_.reserve(staged_.size() + 1);
  auto [fd, temp] = create_temp(path, subject);
  // Registered before writing, so the temporary file is on the one list from its creation.
  staged_.push_back(Staged{path, temp});
  const int err = write_sync_close(fd, bytes);
  if (err != 0) {
    ::unlink(temp.c_str());
    staged_.pop_back();
    throw Error(subject, "cannot write: " + errno_message(err));
  }
}

void OutputFiles::stage_npy(const std::filesystem::path& path, const TensorView& view,
                            DType dtype) {
  stage(path, encode_npy(view, dtype));
}

void OutputFiles::commit() {
  std::set<std::filesystem::path> directories;
  for (Staged& staged : staged_) {
    if (staged.temp.empty()) continue;
    if (::rename(staged.temp.c_str(), staged.destination.c_str()) != 0) {
      throw Error(staged.destination.string(),
                  "cannot move the finished file into place: " + errno_message(errno));
    }
    staged.temp.clear();
    const std::filesystem::path directory = staged.destination.parent_path();
    directories.insert(directory.empty() ? std::filesystem::path(".") : directory);
  }
  staged_.clear();
  for (const auto& directory : directories) sync_directory(directory);
}

void write_npy(const std::filesystem::path& path, const TensorView& view, DType dtype) {
  OutputFiles files;
  files.stage_npy(path, view, dtype);
  files.commit();
}

}  // namespace qkv
