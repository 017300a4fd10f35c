// The zip central directory walked for its names alone (APPNOTE 4.3.12 to 4.3.16): the end of
// central directory record, found from the file's end as libzip finds it, gives the directory's
// offset (the zip64 end record does when the 32-bit fields are saturated); each file header is
// 46 bytes, then the name, the extra field and the comment. Every offset is checked against the
// file's size before it is read; anything unexpected gives an empty result, never a guess.
#include "io/zip_raw_names.h"

#include <algorithm>
#include <cstring>

namespace qkv::io {
namespace {

constexpr std::uint32_t kEndSignature = 0x06054b50;
constexpr std::uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr std::uint32_t kZip64EndSignature = 0x06064b50;
constexpr std::uint32_t kFileHeaderSignature = 0x02014b50;
constexpr std::uint64_t kEndSize = 22, kZip64LocatorSize = 20, kZip64EndSize = 56;
constexpr std::uint64_t kFileHeaderSize = 46, kMaxComment = 65535;

std::uint64_t little_endian(const unsigned char* bytes, int count) {
  std::uint64_t value = 0;
  for (int i = count - 1; i >= 0; --i) value = value << 8 | bytes[i];
  return value;
}

// Reads `count` bytes at `offset` when they lie within the file.
bool read(const InputFile& file, std::uint64_t offset, std::uint64_t count, unsigned char* out) {
  if (offset > file.size() || count > file.size() - offset) return false;
  file.read_at(offset, out, static_cast<std::size_t>(count));
  return true;
}

}  // namespace

std::vector<std::string> zip_raw_names(const InputFile& file, std::uint64_t entries) {
  const std::uint64_t size = file.size();
  if (size < kEndSize) return {};
  const std::uint64_t tail_size = std::min(size, kEndSize + kMaxComment);
  std::vector<unsigned char> tail(static_cast<std::size_t>(tail_size));
  read(file, size - tail_size, tail_size, tail.data());
  // The last end record whose comment ends within the file.
  std::uint64_t end = UINT64_MAX;
  for (std::uint64_t at = tail_size - kEndSize + 1; at-- > 0;) {
    const unsigned char* p = tail.data() + at;
    if (little_endian(p, 4) == kEndSignature &&
        at + kEndSize + little_endian(p + 20, 2) <= tail_size) {
      end = at;
      break;
    }
  }
  if (end == UINT64_MAX) return {};
  const unsigned char* record = tail.data() + end;
  std::uint64_t count = little_endian(record + 10, 2);
  std::uint64_t directory = little_endian(record + 16, 4);
  if (count == 0xffff || directory == 0xffffffff) {
    const std::uint64_t end_offset = size - tail_size + end;
    unsigned char locator[kZip64LocatorSize];
    unsigned char zip64[kZip64EndSize];
    if (end_offset < kZip64LocatorSize ||
        !read(file, end_offset - kZip64LocatorSize, kZip64LocatorSize, locator) ||
        little_endian(locator, 4) != kZip64LocatorSignature ||
        !read(file, little_endian(locator + 8, 8), kZip64EndSize, zip64) ||
        little_endian(zip64, 4) != kZip64EndSignature) {
      return {};
    }
    count = little_endian(zip64 + 32, 8);
    directory = little_endian(zip64 + 48, 8);
  }
  if (count != entries) return {};
  std::vector<std::string> names;
  std::uint64_t at = directory;
  for (std::uint64_t i = 0; i < count; ++i) {
    unsigned char header[kFileHeaderSize];
    if (!read(file, at, kFileHeaderSize, header) ||
        little_endian(header, 4) != kFileHeaderSignature) {
      return {};
    }
    const std::uint64_t name_size = little_endian(header + 28, 2);
    std::string name(static_cast<std::size_t>(name_size), '\0');
    if (!read(file, at + kFileHeaderSize, name_size,
              reinterpret_cast<unsigned char*>(name.data()))) {
      return {};
    }
    names.push_back(std::move(name));
    at +=
        kFileHeaderSize + name_size + little_endian(header + 30, 2) + little_endian(header + 32, 2);
  }
  return names;
}

}  // namespace qkv::io
