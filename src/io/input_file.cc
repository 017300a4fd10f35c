#include "io/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <system_error>

#include "qkv/error.h"

namespace qkv::io {

std::string errno_message(int err) {
  return std::error_code(err, std::generic_category()).message();
}

std::string quote_from_file(std::string_view text, char delimiter, std::size_t limit) {
  std::string out(1, delimiter);
  std::size_t shown = 0;
  for (const char c : text) {
    if (shown++ == limit) {
      out += "...";
      break;
    }
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\\' || c == delimiter) {
      out += '\\';
      out += c;
    } else if (byte >= 0x20 && byte < 0x7f) {
      out += c;
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", static_cast<unsigned>(byte));
      out += escaped;
    }
  }
  return out + delimiter;
}

InputFile::InputFile(const std::filesystem::path& path, const std::string& subject)
    : subject_(subject) {
  do {
    fd_.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd_.fd < 0 && errno == EINTR);
  if (fd_.fd < 0) throw Error(subject_, "cannot open: " + errno_message(errno));
  struct stat info {};
  if (::fstat(fd_.fd, &info) != 0) fail_read(errno);
  if (S_ISDIR(info.st_mode)) fail_read(EISDIR);
  // Only a regular file has a size we can check the header against before reading.
  if (!S_ISREG(info.st_mode)) throw Error(subject_, "cannot read: not a regular file");
  size_ = static_cast<std::uint64_t>(info.st_size);
}

void InputFile::read_at(std::uint64_t offset, void* buffer, std::size_t count) const {
  auto* out = static_cast<char*>(buffer);
  while (count > 0) {
    const ssize_t got = ::pread(fd_.fd, out, count, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail_read(errno);
    }
    // The file was shorter than fstat said: it changed while we read it.
    if (got == 0) throw Error(subject_, "cannot read: the file shrank while being read");
    const auto n = static_cast<std::size_t>(got);
    out += n;
    offset += n;
    count -= n;
  }
}

void InputFile::fail_read(int err) const {
  throw Error(subject_, "cannot read: " + errno_message(err));
}

InputFile::Descriptor::~Descriptor() {
  if (fd >= 0) ::close(fd);
}

}  // namespace qkv::io
