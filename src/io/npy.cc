// NumPy .npy files: a reader that trusts nothing in the file, and an encoder.
//
// The format (numpy.lib.format, NEP 1). A file is
//
//   "\x93NUMPY"  major  minor  header_len  header  data
//     6 bytes    1 byte 1 byte 2 or 4 bytes
//
// Version 1.0 stores header_len as a little-endian uint16; 2.0 and 3.0 as a little-endian
// uint32. The header is a Python dict literal (latin-1 text in 1.0 and 2.0, UTF-8 in 3.0),
// padded with spaces and ended by '\n' so that the data starts on a 64-byte boundary (16 in
// NumPy before 1.14; any offset is accepted when reading):
//
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
//
// 'descr' is the dtype ('<' little-endian, 'f' float, 4 bytes), 'shape' a tuple of
// non-negative integers ("()" for a scalar, "(5,)" for one dimension) and the data is the
// prod(shape) * itemsize bytes of the array, here in C order.
//
// Threat model. The file may come from anyone and may have been written to crash us, to make
// us allocate without bound, or to make us read out of bounds or produce an invalid value.
// Hence:
//  - Every length taken from the file is checked against the file's size before it is used:
//    the header must lie within the file, and the data size computed from the shape must equal
//    the bytes the file holds before the tensor is allocated. Nothing larger than the header
//    (capped at kMaxHeaderBytes) is allocated until then.
//  - The header is parsed, never evaluated, by a small hand-written parser that accepts
//    only what an .npy header needs: strings, True/False and tuples of non-negative integers.
//    Keys must be exactly 'descr', 'fortran_order' and 'shape', each once.
//  - Shape arithmetic is overflow-checked: each dimension, their product and the byte count
//    must fit in int64.
//  - Integers are read only by read_npy_offsets, which reads nothing else: a float file given
//    as offsets, or an integer file given as values, is refused rather than converted.
//  - Bool data is checked byte by byte: a C++ bool holding anything but 0 or 1 is undefined
//    behaviour, so such a file is rejected rather than loaded.
//  - Bytes from the file are quoted in messages only after escaping, so that every error stays
//    one printable line however hostile the header.
//  - The file must hold exactly the data its header describes. NumPy ignores trailing bytes;
//    we reject them, because a file longer than its header says was not written by np.save
//    and is more likely a wrong shape or dtype than something safe to ignore.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "core/format_bytes.h"
#include "core/out_of_memory.h"
#include "io/input_file.h"
#include "io/npy_bytes.h"
#include "io/npy_dtype.h"
#include "io/row_spans.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv {
namespace {

using core::format_bytes;
using io::errno_message;
using io::InputFile;

static_assert(std::endian::native == std::endian::little,
              "qkv reads and writes little-endian .npy data by copying bytes");
static_assert(sizeof(std::size_t) >= sizeof(std::uint64_t), "qkv needs a 64-bit size_t");

constexpr std::string_view kMagic{"\x93NUMPY", 6};
// NumPy's reader refuses headers above 10000 bytes unless told otherwise; its writer switches
// to version 2.0 only past 65535. A header for the dtypes we accept is under 200 bytes plus the
// shape, so 1 MiB admits every honest file with room to spare while bounding what a hostile
// header length can make us allocate and scan before anything has been validated.
constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{1} << 20;
// NumPy 2 arrays have at most 64 dimensions (32 before); nothing honest has more.
constexpr std::size_t kMaxRank = 64;
// The data offset is a multiple of this, as NumPy writes it, so the data can be memory-mapped.
constexpr std::size_t kAlignment = 64;

using io::NpyAccept;

// Text from the file, quoted as Python's repr would and made safe for a one-line message.
std::string quote(std::string_view text) { return io::quote_npy_text(text); }

// "()", "(5,)", "(2, 3)": the way Python writes a tuple, as NumPy's header does.
std::string shape_tuple(const Shape& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + (shape.size() == 1 ? ",)" : ")");
}

struct Header {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

// The header dict, parsed as the subset of Python literal syntax that .npy headers use:
//   dict  := '{' [item (',' item)* [',']] '}'        item := string ':' value
//   value := string | 'True' | 'False' | tuple      tuple := '(' [int (',' int)* [',']] ')'
// with Python's rule that "(5)" is not a tuple. Whitespace may surround any token, and only
// whitespace may follow the dict (NumPy pads with spaces and a newline).
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& subject, NpyAccept accept)
      : text_(text), subject_(subject), accept_(accept) {}

  Header parse() {
    Header header;
    bool seen_descr = false;
    bool seen_fortran_order = false;
    bool seen_shape = false;
    skip_space();
    expect('{', "at the start of the header");
    skip_space();
    while (!consume('}')) {
      const std::size_t key_at = pos_;
      const std::string key = parse_string("a key or '}'");
      auto mark_seen = [&](bool& seen) {
        if (seen) fail_at(key_at, "duplicate key " + quote(key));
        seen = true;
      };
      skip_space();
      expect(':', ("after the key " + quote(key)).c_str());
      skip_space();
      if (key == "descr") {
        mark_seen(seen_descr);
        // A list here is a structured dtype: worth naming rather than calling it malformed.
        if (peek() == '[') {
          throw Error(subject_, "structured dtypes (record arrays) are not supported; " +
                                    std::string(io::npy_supported(accept_)));
        }
        header.descr = parse_string("a string for 'descr'");
      } else if (key == "fortran_order") {
        mark_seen(seen_fortran_order);
        header.fortran_order = parse_bool();
      } else if (key == "shape") {
        mark_seen(seen_shape);
        header.shape = parse_shape();
      } else {
        fail_at(key_at, "unknown key " + quote(key) +
                            "; an .npy header has exactly 'descr', 'fortran_order' and 'shape'");
      }
      skip_space();
      if (consume(',')) {
        skip_space();
      } else if (peek() != '}') {
        fail("expected ',' or '}' after the value of " + quote(key));
      }
    }
    skip_space();
    if (pos_ < text_.size()) fail("unexpected text after the closing '}'");
    if (!seen_descr) missing("descr");
    if (!seen_fortran_order) missing("fortran_order");
    if (!seen_shape) missing("shape");
    return header;
  }

 private:
  [[noreturn]] void fail_at(std::size_t at, const std::string& what) const {
    throw Error(subject_, "malformed header at byte " + std::to_string(at) + ": " + what);
  }
  [[noreturn]] void fail(const std::string& what) const { fail_at(pos_, what); }
  [[noreturn]] void missing(const char* key) const {
    throw Error(subject_, std::string("malformed header: missing key '") + key + "'");
  }

  // The next character, or '\0' at the end (a NUL inside the header is never valid anyway).
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c, const char* where) {
    if (consume(c)) return;
    if (pos_ >= text_.size()) {
      fail(std::string("the header ends where '") + c + "' is expected " + where);
    }
    fail(std::string("expected '") + c + "' " + where + ", found " + quote(text_.substr(pos_, 1)));
  }
  void skip_space() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') break;
      ++pos_;
    }
  }
  // A short excerpt from the current position, for "expected X, found Y".
  std::string describe_next() const {
    if (pos_ >= text_.size()) return "the end of the header";
    std::string_view excerpt = text_.substr(pos_, 12);
    const std::size_t last = excerpt.find_last_not_of(" \t\n\r");
    return quote(excerpt.substr(0, last == std::string_view::npos ? 1 : last + 1));
  }

  // A Python string literal in ' or ". Escapes never occur in a valid header; refusing them
  // keeps the parser small.
  std::string parse_string(const char* what) {
    const char open = peek();
    if (open != '\'' && open != '"')
      fail(std::string("expected ") + what + ", found " + describe_next());
    const std::size_t start = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != open) {
      const char c = text_[pos_];
      if (c == '\\') fail("escape sequences are not supported in header strings");
      if (c == '\n' || c == '\r') fail_at(start - 1, "unterminated string");
      ++pos_;
    }
    if (pos_ >= text_.size()) fail_at(start - 1, "unterminated string");
    std::string value(text_.substr(start, pos_ - start));
    ++pos_;
    return value;
  }

  bool parse_bool() {
    for (const auto& [word, value] :
         {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}}) {
      if (text_.substr(pos_, word.size()) == word && !is_identifier_char(pos_ + word.size())) {
        pos_ += word.size();
        return value;
      }
    }
    fail("'fortran_order' must be True or False, found " + describe_next());
  }

  bool is_identifier_char(std::size_t at) const {
    if (at >= text_.size()) return false;
    const char c = text_[at];
    return c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  }

  Shape parse_shape() {
    if (peek() != '(') fail("'shape' must be a tuple such as (2, 3), found " + describe_next());
    const std::size_t open_at = pos_++;
    Shape shape;
    bool trailing_comma = false;
    skip_space();
    while (!consume(')')) {
      if (shape.size() == kMaxRank) {
        throw Error(subject_, "shape has more than " + std::to_string(kMaxRank) +
                                  " dimensions; NumPy arrays have at most " +
                                  std::to_string(kMaxRank));
      }
      shape.push_back(parse_dim());
      skip_space();
      trailing_comma = consume(',');
      skip_space();
      if (!trailing_comma && peek() != ')') {
        fail("expected ',' or ')' in 'shape', found " + describe_next());
      }
    }
    if (shape.size() == 1 && !trailing_comma) {
      fail_at(open_at, "'shape' (" + std::to_string(shape[0]) +
                           ") is not a tuple; a 1-D shape is written (" + std::to_string(shape[0]) +
                           ",)");
    }
    return shape;
  }

  std::int64_t parse_dim() {
    const std::size_t start = pos_;
    if (peek() == '-') {
      std::size_t end = start + 1;
      while (end < text_.size() && text_[end] >= '0' && text_[end] <= '9') ++end;
      throw Error(subject_,
                  "negative dimension " + quote(text_.substr(start, end - start)) + " in 'shape'");
    }
    if (peek() < '0' || peek() > '9') {
      fail("'shape' must hold non-negative integers, found " + describe_next());
    }
    std::int64_t value = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (value > (std::numeric_limits<std::int64_t>::max() - digit) / 10) {
        while (peek() >= '0' && peek() <= '9') ++pos_;
        throw Error(subject_, "dimension " + quote(text_.substr(start, pos_ - start)) +
                                  " in 'shape' is too large for a 64-bit integer");
      }
      value = value * 10 + digit;
      ++pos_;
    }
    // Python 2 NumPy wrote dimensions as longs: (3L, 4L).
    if (peek() == 'L' || peek() == 'l') ++pos_;
    if (is_identifier_char(pos_) || peek() == '.') {
      fail_at(start,
              "'shape' must hold non-negative integers, found " + quote(text_.substr(start, 12)));
    }
    return value;
  }

  std::string_view text_;
  const std::string& subject_;
  NpyAccept accept_;
  std::size_t pos_ = 0;
};

std::uint32_t read_le(const unsigned char* bytes, int count) {
  std::uint32_t value = 0;
  for (int i = count - 1; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

// What the header of an .npy file says, once checked against the file: the peek
// (inspect_npy) and the reader (read_npy) share this one parse.
struct Layout {
  DType dtype = DType::kF32;
  Shape shape;
  std::uint64_t data_offset = 0;
  std::uint64_t data_bytes = 0;  // exactly what the file holds after the header
};

Layout read_layout(io::NpyBytes& file, const std::string& subject, NpyAccept accept) {
  const std::uint64_t file_size = file.size();
  if (file_size == 0) throw Error(subject, "is empty (0 bytes), not an .npy file");

  // The fixed part: magic, version, header length (12 bytes at most).
  std::array<unsigned char, 12> fixed{};
  const std::size_t fixed_read = file_size < fixed.size() ? file_size : fixed.size();
  file.read_at(0, fixed.data(), fixed_read);
  const std::string_view start(reinterpret_cast<const char*>(fixed.data()), fixed_read);

  if (start.starts_with(std::string_view("PK\x03\x04", 4)) ||
      start.starts_with(std::string_view("PK\x05\x06", 4))) {
    throw Error(subject,
                "is an .npz archive, not an .npy file; save each array with np.save instead");
  }
  if (!start.starts_with(kMagic)) {
    if (kMagic.starts_with(start)) {
      throw Error(subject,
                  "is truncated: " + format_bytes(file_size) + " is too short for an .npy header");
    }
    throw Error(subject, "not an .npy file (it does not start with \"\\x93NUMPY\")");
  }
  if (fixed_read < 8) {
    throw Error(subject,
                "is truncated: " + format_bytes(file_size) + " is too short for an .npy header");
  }
  const unsigned major = fixed[6];
  const unsigned minor = fixed[7];
  if (minor != 0 || major < 1 || major > 3) {
    throw Error(subject, "unsupported .npy format version " + std::to_string(major) + "." +
                             std::to_string(minor) + "; qkv reads versions 1.0, 2.0 and 3.0");
  }
  const int length_bytes = major == 1 ? 2 : 4;
  const std::size_t preamble = 8 + static_cast<std::size_t>(length_bytes);
  if (fixed_read < preamble) {
    throw Error(subject,
                "is truncated: " + format_bytes(file_size) + " is too short for an .npy header");
  }
  const std::uint64_t header_length = read_le(fixed.data() + 8, length_bytes);
  if (header_length > kMaxHeaderBytes) {
    throw Error(subject, "header length " + std::to_string(header_length) + " bytes exceeds the " +
                             format_bytes(kMaxHeaderBytes) + " limit");
  }
  if (header_length > file_size - preamble) {
    throw Error(subject, "truncated header: its length field says " +
                             std::to_string(header_length) + " bytes but the file ends " +
                             std::to_string(file_size - preamble) + " bytes after the preamble");
  }

  std::string header_text(header_length, '\0');
  file.read_at(preamble, header_text.data(), header_text.size());
  const Header header = HeaderParser(header_text, subject, accept).parse();
  const DType dtype = io::npy_dtype_from_descr(header.descr, subject, accept);
  if (header.fortran_order) {
    throw Error(subject, "Fortran order is not supported; save with np.ascontiguousarray");
  }

  // Every dimension is checked, even past a zero one, so that the shape is one any code
  // computing its size in int64 can take.
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  std::int64_t product = 1;
  bool has_zero = false;
  for (const std::int64_t dim : header.shape) {
    if (dim == 0) {
      has_zero = true;
      continue;
    }
    if (product > kMax / dim) {
      throw Error(subject, "shape " + shape_tuple(header.shape) +
                               " overflows: its element count does not fit in 64 bits");
    }
    product *= dim;
  }
  const std::int64_t numel = has_zero ? 0 : product;
  const auto item_size = static_cast<std::int64_t>(dtype_size(dtype));
  if (numel > kMax / item_size) {
    throw Error(subject, "shape " + shape_tuple(header.shape) +
                             " overflows: its size in bytes does not fit in 64 bits");
  }
  const auto data_bytes = static_cast<std::uint64_t>(numel * item_size);
  const std::uint64_t data_offset = preamble + header_length;
  const std::uint64_t available = file_size - data_offset;
  if (data_bytes > available) {
    throw Error(subject, "header claims " + std::to_string(numel) + " " + dtype_name(dtype) +
                             " values (" + format_bytes(data_bytes) + ") but the file holds " +
                             format_bytes(available) + " of data");
  }
  if (data_bytes < available) {
    const std::uint64_t extra = available - data_bytes;
    throw Error(subject, "file has " + std::to_string(extra) +
                             (extra == 1 ? " extra byte" : " extra bytes") +
                             " after the data that its header describes (" + std::to_string(numel) +
                             " " + dtype_name(dtype) + " values)");
  }
  return Layout{dtype, header.shape, data_offset, data_bytes};
}

// An .npy file on disk, as the parser reads it.
class FileBytes final : public io::NpyBytes {
 public:
  FileBytes(const std::filesystem::path& path, const std::string& subject) : file_(path, subject) {}
  std::uint64_t size() const override { return file_.size(); }
  void read_at(std::uint64_t offset, void* buffer, std::size_t count) override {
    file_.read_at(offset, buffer, count);
  }

 private:
  InputFile file_;
};

TensorInfo inspect(const std::filesystem::path& path, NpyAccept accept) {
  const std::string subject = path.string();
  FileBytes file(path, subject);
  return io::inspect_npy_bytes(file, subject, accept);
}

Tensor read(const std::filesystem::path& path, NpyAccept accept) {
  const std::string subject = path.string();
  FileBytes file(path, subject);
  return io::read_npy_bytes(file, subject, accept);
}

}  // namespace

TensorInfo io::inspect_npy_bytes(io::NpyBytes& bytes, const std::string& subject,
                                 NpyAccept accept) {
  Layout layout = read_layout(bytes, subject, accept);
  return TensorInfo{subject, layout.dtype, std::move(layout.shape), layout.data_bytes};
}

Tensor io::read_npy_bytes(io::NpyBytes& bytes, const std::string& subject, NpyAccept accept) {
  const Layout layout = read_layout(bytes, subject, accept);
  const std::uint64_t data_bytes = layout.data_bytes;
  Tensor tensor;
  try {
    tensor = Tensor(layout.dtype, layout.shape, subject);
  } catch (const core::OutOfMemory& e) {
    throw Error(subject, "out of memory reading " + e.allocation());
  }
  if (data_bytes > 0) bytes.read_at(layout.data_offset, tensor.data(), data_bytes);
  if (layout.dtype == DType::kBool) {
    const auto* values = static_cast<const unsigned char*>(tensor.data());
    for (std::uint64_t i = 0; i < data_bytes; ++i) {
      if (values[i] > 1) {
        throw Error(subject, "bool element " + std::to_string(i) + " holds the byte " +
                                 std::to_string(values[i]) + "; bool data must be 0 or 1");
      }
    }
  }
  return tensor;
}

Tensor io::read_npy_bytes_rows(io::NpyBytes& bytes, const std::string& subject,
                               NpyAccept accept, std::span<const RowSpan> spans) {
  const Layout layout = read_layout(bytes, subject, accept);
  const TensorInfo info{subject, layout.dtype, layout.shape, layout.data_bytes};
  return io::read_row_spans(info, layout.data_offset, spans,
                            [&](std::uint64_t offset, void* buffer, std::size_t count) {
                              bytes.read_at(offset, buffer, count);
                            });
}

Tensor read_npy_rows(const std::filesystem::path& path, std::span<const RowSpan> spans) {
  const std::string subject = path.string();
  FileBytes file(path, subject);
  return io::read_npy_bytes_rows(file, subject, NpyAccept::kValues, spans);
}

TensorInfo inspect_npy(const std::filesystem::path& path) {
  return inspect(path, NpyAccept::kValues);
}

Tensor read_npy(const std::filesystem::path& path) { return read(path, NpyAccept::kValues); }

TensorInfo inspect_npy_offsets(const std::filesystem::path& path) {
  return inspect(path, NpyAccept::kOffsets);
}

Tensor read_npy_offsets(const std::filesystem::path& path) {
  return read(path, NpyAccept::kOffsets);
}

std::vector<char> encode_npy(const TensorView& view, DType dtype) {
  if (dtype == DType::kBF16) {
    throw Error(view.name, "cannot be written as bfloat16 to .npy (NumPy has no bfloat16 dtype)");
  }
  // A view already contiguous and of `dtype` (every output qkv writes) is copied straight into
  // the bytes; only a conversion or a strided view needs a contiguous copy first.
  Tensor converted;
  const void* data = view.data;
  if (view.dtype != dtype || !view.is_contiguous()) {
    converted = contiguous_copy(view, dtype);
    data = converted.data();
  }
  const std::size_t data_bytes = static_cast<std::size_t>(view.numel()) * dtype_size(dtype);
  std::string header = std::string("{'descr': '") + io::npy_descr_of(dtype) +
                       "', 'fortran_order': False, 'shape': " + shape_tuple(view.shape) + ", }";

  // Pad with spaces and a final '\n' so that the data starts on an aligned offset.
  auto padded_length = [&](std::size_t preamble) {
    const std::size_t unpadded = preamble + header.size() + 1;
    return (unpadded + kAlignment - 1) / kAlignment * kAlignment - preamble;
  };
  unsigned char major = 1;
  std::size_t preamble = 10;
  std::size_t header_length = padded_length(preamble);
  if (header_length > 0xffff) {
    major = 2;
    preamble = 12;
    header_length = padded_length(preamble);
  }
  header.append(header_length - header.size() - 1, ' ');
  header.push_back('\n');

  std::vector<char> out;
  const std::size_t total = preamble + header_length + data_bytes;
  try {
    out.resize(total);
  } catch (const std::bad_alloc&) {
    throw core::OutOfMemory(view.name,
                            core::format_bytes_exact(total) + " for the .npy encoding of a " +
                                dtype_name(dtype) + " tensor " + shape_string(view.shape),
                            total);
  }
  char* at = out.data();
  std::memcpy(at, kMagic.data(), kMagic.size());
  at += kMagic.size();
  *at++ = static_cast<char>(major);
  *at++ = 0;
  for (std::size_t i = 0; i < preamble - 8; ++i) {
    *at++ = static_cast<char>((header_length >> (8 * i)) & 0xff);
  }
  std::memcpy(at, header.data(), header.size());
  at += header.size();
  if (data_bytes > 0) std::memcpy(at, data, data_bytes);
  return out;
}

}  // namespace qkv
