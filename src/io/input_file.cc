#include "io/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <system_error>

#include "qkv/error.h"
#include "qkv/io.h"

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

std::string printable_name(std::string_view name) {
  std::string shown;
  for (const char c : name) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", static_cast<unsigned>(byte));
      shown += escaped;
    } else {
      shown += c;
    }
  }
  return shown;
}

std::string file_kind(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "a regular file";
    case S_IFDIR:
      return "a directory";
    case S_IFIFO:
      return "a FIFO";
    case S_IFSOCK:
      return "a socket";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFLNK:
      return "a symbolic link";
    default:
      return "of an unknown type";
  }
}

InputFile::InputFile(const std::filesystem::path& path, const std::string& subject)
    : subject_(subject) {
  // The type is known only once the file is open, and open(2) itself blocks on a FIFO until a
  // writer comes (forever, if none does). O_NONBLOCK makes that open return at once, and means
  // nothing for the regular files kept below; O_NOCTTY keeps a terminal from becoming ours.
  do {
    fd_.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  } while (fd_.fd < 0 && errno == EINTR);
  if (fd_.fd < 0) {
    const int err = errno;
    // A socket cannot be opened at all (ENXIO): say what it is rather than "No such device".
    struct stat info {};
    if (err == ENXIO && ::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
      throw Error(subject_, "cannot read: not a regular file (" + file_kind(info.st_mode) + ")");
    }
    throw Error(subject_, "cannot open: " + errno_message(err));
  }
  struct stat info {};
  if (::fstat(fd_.fd, &info) != 0) fail_read(errno);
  if (S_ISDIR(info.st_mode)) fail_read(EISDIR);
  // Only a regular file has a size we can check the header against before reading, and only
  // a regular file is sure to end.
  if (!S_ISREG(info.st_mode)) {
    throw Error(subject_, "cannot read: not a regular file (" + file_kind(info.st_mode) + ")");
  }
  const int flags = ::fcntl(fd_.fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd_.fd, F_SETFL, flags & ~O_NONBLOCK) != 0) fail_read(errno);
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

namespace qkv {

std::string read_text_file(const std::filesystem::path& path, std::uint64_t max_bytes,
                           const std::string& what) {
  const std::string subject = path.string();
  const io::InputFile file(path, subject);
  if (file.size() > max_bytes) {
    constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
    const std::string limit = max_bytes % kMiB == 0 ? std::to_string(max_bytes / kMiB) + " MiB"
                                                    : std::to_string(max_bytes) + " bytes";
    throw Error(subject, "is larger than the " + limit + " " + what + " may hold (" +
                             std::to_string(file.size()) + " bytes)");
  }
  std::string text(file.size(), '\0');
  file.read_at(0, text.data(), text.size());
  return text;
}

}  // namespace qkv
