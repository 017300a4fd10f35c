// Helpers shared by the fuzz targets.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace qkv::fuzz {

// The fuzz input as a file, without touching a disk: an anonymous memory file (memfd) whose
// /proc/self/fd path the readers open like any regular file.
class MemoryFile {
 public:
  MemoryFile(const void* data, std::size_t size) {
    fd_ = ::memfd_create("qkv-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) die("memfd_create failed");
    const auto* bytes = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t wrote = ::write(fd_, bytes, size);
      if (wrote <= 0) die("write to memfd failed");
      bytes += wrote;
      size -= static_cast<std::size_t>(wrote);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  const std::string& path() const noexcept { return path_; }

 private:
  [[noreturn]] static void die(const char* what) {
    std::fprintf(stderr, "fuzz: %s\n", what);
    std::abort();
  }
  int fd_ = -1;
  std::string path_;
};

// A finding: print it and abort, so that libFuzzer (or the replay driver) reports the input.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
  std::abort();
}

// Every error the library reports must be one printable line.
inline void check_one_line(const char* message) {
  if (std::strchr(message, '\n') != nullptr || std::strchr(message, '\r') != nullptr) {
    fail(std::string("multi-line error message: ") + message);
  }
  if (*message == '\0') fail("empty error message");
}

}  // namespace qkv::fuzz
