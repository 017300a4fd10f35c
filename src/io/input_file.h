// Reading an untrusted file: a descriptor closed on every path out, the size known before any
// header is believed, and every read exact. Shared by the .npy and safetensors readers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace qkv::io {

// The system's text for an errno value ("No such file or directory"), for every io message.
std::string errno_message(int err);

// `text` read from a file, between `delimiter`s, made safe for a one-line message: the
// delimiter and backslash escaped, bytes outside printable ASCII as \xNN, at most `limit`
// characters shown before "...". A hostile file cannot break or colour the line.
std::string quote_from_file(std::string_view text, char delimiter, std::size_t limit);

// A name the user gave (a tensor's or an archive member's), kept to one line for the subject of
// a message: control characters (below 0x20, and 0x7f) as \xNN, every other byte as given.
std::string printable_name(std::string_view name);

// What a file that is not regular is, for messages: "a FIFO", "a character device", "a
// socket", ...
std::string file_kind(unsigned mode);

// A regular file opened for reading, closed on every path out.
class InputFile {
 public:
  // Opens `path`; errors are qkv::Error with `subject` (which must outlive this object). Anything
  // but a regular file (a FIFO, a socket, a device such as /dev/zero, a /proc/self/fd link to a
  // pipe) is refused, without blocking: "cannot read: not a regular file (a FIFO)".
  InputFile(const std::filesystem::path& path, const std::string& subject);
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  std::uint64_t size() const noexcept { return size_; }

  // Reads exactly `count` bytes at `offset`, which the caller has checked lie within size().
  void read_at(std::uint64_t offset, void* buffer, std::size_t count) const;

 private:
  [[noreturn]] void fail_read(int err) const;

  // Owns the descriptor, so that it is closed also when the constructor throws.
  struct Descriptor {
    int fd = -1;
    ~Descriptor();
  };

  const std::string& subject_;
  Descriptor fd_;
  std::uint64_t size_ = 0;
};

}  // namespace qkv::io
