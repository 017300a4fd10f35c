// Safetensors files: a reader that validates the whole header before reading any tensor.
//
// The format (huggingface/safetensors). A file is
//
//   N        header                data buffer
//   8 bytes  N bytes of JSON       the tensors' bytes, back to back
//
// N is a little-endian uint64. The header is a UTF-8 JSON object that maps each tensor name to
//   {"dtype": "F32", "shape": [768, 2304], "data_offsets": [BEGIN, END]}
// where BEGIN and END are byte offsets into the data buffer (END exclusive), plus an optional
// "__metadata__" object of string values. Writers may pad the header with trailing spaces so
// that the buffer is aligned. Tensors are little-endian and C order.
//
// Validation, as the reference implementation (safetensors' Rust crate, `SafeTensors::
// read_metadata` and `Metadata::validate`) does it, in this order:
//  - N is at most kMaxHeaderBytes (100 MB, the reference's bound) and 8 + N lies within the file;
//  - the header is valid UTF-8 JSON that starts with '{' and holds only the keys above;
//  - every tensor has a known dtype, a shape of non-negative integers and two data offsets;
//  - sorted by offsets, the tensors tile the buffer: the first starts at 0, each starts where
//    the previous ends (no gap, no overlap), and END - BEGIN = numel · bits / 8, computed
//    without overflow and a whole number of bytes;
//  - the last tensor ends exactly at the end of the file.
// Stricter than the reference, as the .npy reader is: a tensor name may appear only once (a
// JSON parser would silently keep one of them), unknown keys in a tensor's entry are refused,
// and bool data must be 0 or 1.
//
// Threat model as for .npy: nothing larger than the header is allocated before the offsets
// have been checked against the file's size, the header is parsed by a SAX handler that keeps
// only what it needs (no document tree, nesting limited to the format's three levels), and
// bytes from the file reach messages only escaped, so that every error is one printable line.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/out_of_memory.h"
#include "io/input_file.h"
#include "io/row_spans.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv {
namespace {

using io::errno_message;
using io::InputFile;

static_assert(std::endian::native == std::endian::little,
              "qkv reads little-endian safetensors data by copying bytes");

// The reference implementation's bound (safetensors::tensor::MAX_HEADER_SIZE).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::size_t kMaxRank = 64;
constexpr std::size_t kQuoteLimit = 60;
constexpr const char* kSupported = "qkv reads F32, F64, F16, BF16 and BOOL";

// Text from the file in single quotes, made safe for a one-line message.
std::string quote(std::string_view text) { return io::quote_from_file(text, '\'', kQuoteLimit); }

std::string str(std::uint64_t n) { return std::to_string(n); }

// Bits per element of every dtype the format defines, so that a file can be validated whole
// even when it holds tensors qkv does not read. 0: not a safetensors dtype.
std::uint64_t dtype_bits(std::string_view dtype) {
  static constexpr std::array<std::pair<std::string_view, std::uint64_t>, 22> kBits = {{
      {"BOOL", 8},      {"U8", 8},          {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8},
      {"F8_E8M0", 8},   {"I16", 16},        {"U16", 16}, {"F16", 16},    {"BF16", 16},
      {"I32", 32},      {"U32", 32},        {"F32", 32}, {"F64", 64},    {"I64", 64},
      {"U64", 64},      {"C64", 64},        {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6},
      {"F8_E4M3FN", 8}, {"F8_E5M2FNUZ", 8},
  }};
  for (const auto& [name, bits] : kBits) {
    if (name == dtype) return bits;
  }
  return 0;
}


// Parses the header into entries, refusing anything the format does not allow. Each callback
// returns false to stop the parser at the first problem, which it records in error().
class HeaderHandler final : public nlohmann::json_sax<nlohmann::json> {
 public:
  const std::string& error() const noexcept { return error_; }
  std::vector<SafetensorsEntry>& entries() noexcept { return entries_; }

  bool null() override { return unexpected("null"); }
  bool boolean(bool) override { return unexpected("a boolean"); }
  bool number_integer(number_integer_t value) override {
    if (value >= 0) return number_unsigned(static_cast<number_unsigned_t>(value));
    return unexpected("a negative number");
  }
  bool number_unsigned(number_unsigned_t value) override {
    if (depth_ != 3) return unexpected("a number");
    std::vector<std::uint64_t>& list = field_ == Field::kShape ? shape_ : offsets_;
    if (list.size() == (field_ == Field::kShape ? kMaxRank : 2)) {
      return fail(field_ == Field::kShape
                      ? "has more than " + str(kMaxRank) + " dimensions"
                      : "'data_offsets' must hold exactly two numbers [BEGIN, END]");
    }
    list.push_back(value);
    return true;
  }
  bool number_float(number_float_t, const string_t& text) override {
    return unexpected("the number " + quote(text) + " (not a non-negative integer within 64 bits)");
  }
  bool binary(binary_t&) override { return unexpected("binary data"); }

  bool string(string_t& value) override {
    if (depth_ == 2 && in_metadata_) return true;
    if (depth_ == 2 && field_ == Field::kDtype) {
      if (has_dtype_) return fail("has 'dtype' twice");
      if (dtype_bits(value) == 0) {
        return fail("has unknown dtype " + quote(value) +
                    " (safetensors dtypes: BOOL, U8, I8, F16, BF16, F32, F64, I64, ...)");
      }
      current_.dtype = value;
      has_dtype_ = true;
      return true;
    }
    return unexpected("a string");
  }

  bool start_object(std::size_t) override {
    if (depth_ == 0) {
      depth_ = 1;
      return true;
    }
    if (depth_ != 1) return unexpected("an object");
    depth_ = 2;
    if (in_metadata_) return true;
    current_ = SafetensorsEntry{};
    current_.name = name_;
    has_dtype_ = has_shape_ = has_offsets_ = false;
    return true;
  }

  bool key(string_t& key) override {
    if (depth_ == 1) {
      name_ = key;
      if (!names_.insert(key).second) {
        return fail_root("holds the name " + quote(key) + " more than once");
      }
      in_metadata_ = key == "__metadata__";
      return true;
    }
    if (in_metadata_) return true;
    if (key == "dtype") {
      field_ = Field::kDtype;
    } else if (key == "shape") {
      field_ = Field::kShape;
    } else if (key == "data_offsets") {
      field_ = Field::kOffsets;
    } else {
      return fail("has the unknown key " + quote(key) +
                  " (expected 'dtype', 'shape' and 'data_offsets')");
    }
    return true;
  }

  bool end_object() override {
    if (depth_ == 1) {
      depth_ = 0;
      return true;
    }
    depth_ = 1;
    if (in_metadata_) {
      in_metadata_ = false;
      return true;
    }
    if (!has_dtype_) return fail("has no 'dtype'");
    if (!has_shape_) return fail("has no 'shape'");
    if (!has_offsets_) return fail("has no 'data_offsets'");
    entries_.push_back(std::move(current_));
    return true;
  }

  bool start_array(std::size_t) override {
    if (depth_ != 2 || in_metadata_) return unexpected("a list");
    if (field_ == Field::kShape) {
      if (has_shape_) return fail("has 'shape' twice");
      shape_.clear();
    } else if (field_ == Field::kOffsets) {
      if (has_offsets_) return fail("has 'data_offsets' twice");
      offsets_.clear();
    } else {
      return unexpected("a list");
    }
    depth_ = 3;
    return true;
  }

  bool end_array() override {
    depth_ = 2;
    if (field_ == Field::kShape) {
      for (const std::uint64_t dim : shape_) {
        if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
          return fail("has dimension " + str(dim) + ", too large for a 64-bit signed integer");
        }
        current_.shape.push_back(static_cast<std::int64_t>(dim));
      }
      has_shape_ = true;
    } else {
      if (offsets_.size() != 2) {
        return fail("'data_offsets' must hold exactly two numbers [BEGIN, END]");
      }
      current_.begin = offsets_[0];
      current_.end = offsets_[1];
      has_offsets_ = true;
    }
    return true;
  }

  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& exception) override {
    if (!error_.empty()) return false;
    // nlohmann's message starts "[json.exception.parse_error.101] parse error at line 1, column
    // 7: "; keep what follows and give a byte position instead.
    std::string what = exception.what();
    const std::size_t colon = what.find(": ");
    if (colon != std::string::npos) what = what.substr(colon + 2);
    const std::size_t last_read = what.find("; last read: ");
    if (last_read != std::string::npos) what = what.substr(0, last_read);
    error_ = "malformed JSON header at byte " + str(position) + ": " + what + " (near " +
             quote(last_token) + ")";
    return false;
  }

 private:
  enum class Field { kDtype, kShape, kOffsets };

  bool fail_root(const std::string& problem) {
    if (error_.empty()) error_ = "header " + problem;
    return false;
  }
  bool fail(const std::string& problem) {
    if (error_.empty()) {
      // "tensor 'q' has no 'dtype'", but "tensor 'q': 'shape' must ...".
      const std::string separator = problem.starts_with("'") ? ": " : " ";
      error_ = in_metadata_ ? "'__metadata__' " + problem
                            : "tensor " + quote(name_) + separator + problem;
    }
    return false;
  }
  bool unexpected(const std::string& what) {
    if (depth_ == 0) return fail_root("is not a JSON object");
    if (depth_ == 1) return fail("must map to an object, found " + what);
    if (in_metadata_) return fail("values must be strings, found " + what);
    if (depth_ == 2) {
      switch (field_) {
        case Field::kDtype:
          return fail("'dtype' must be a string, found " + what);
        case Field::kShape:
          return fail("'shape' must be a list of non-negative integers, found " + what);
        case Field::kOffsets:
          return fail("'data_offsets' must be a list [BEGIN, END], found " + what);
      }
    }
    return fail(std::string(field_ == Field::kShape ? "'shape'" : "'data_offsets'") +
                " must hold non-negative integers, found " + what);
  }

  std::vector<SafetensorsEntry> entries_;
  std::unordered_set<std::string> names_;
  SafetensorsEntry current_;
  std::string name_;
  std::vector<std::uint64_t> shape_, offsets_;
  std::string error_;
  int depth_ = 0;  // 1: the root object; 2: a tensor entry; 3: a shape or offsets list
  Field field_ = Field::kDtype;
  bool in_metadata_ = false;
  bool has_dtype_ = false, has_shape_ = false, has_offsets_ = false;
};

// The bytes tensor `entry` occupies, or throws naming it if that overflows or is not a whole
// number of bytes.
std::uint64_t tensor_bytes(const SafetensorsEntry& entry, const std::string& subject) {
  std::uint64_t numel = 1;
  for (const std::int64_t dim : entry.shape) {
    const auto d = static_cast<std::uint64_t>(dim);
    if (d != 0 && numel > std::numeric_limits<std::uint64_t>::max() / d) {
      throw Error(subject, "tensor " + quote(entry.name) + " has shape " +
                               shape_string(entry.shape) + " whose size overflows 64 bits");
    }
    numel *= d;
  }
  const std::uint64_t bits = dtype_bits(entry.dtype);
  if (numel > std::numeric_limits<std::uint64_t>::max() / bits) {
    throw Error(subject, "tensor " + quote(entry.name) + " has shape " + shape_string(entry.shape) +
                             " whose size in bytes overflows 64 bits");
  }
  if (numel * bits % 8 != 0) {
    throw Error(subject, "tensor " + quote(entry.name) + " of " + str(numel) + " " + entry.dtype +
                             " values is not a whole number of bytes");
  }
  return numel * bits / 8;
}

struct Index {
  std::vector<SafetensorsEntry> entries;  // sorted by offsets
  std::uint64_t data_offset = 0;          // of the buffer in the file
};

Index read_index(const InputFile& file, const std::string& subject) {
  const std::uint64_t file_size = file.size();
  if (file_size < 8) {
    throw Error(subject, "is truncated: " + str(file_size) +
                             " bytes is too short for a safetensors header length (8 bytes)");
  }
  std::array<unsigned char, 8> length_bytes{};
  file.read_at(0, length_bytes.data(), length_bytes.size());
  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i)
    header_length = (header_length << 8) | length_bytes[static_cast<std::size_t>(i)];
  if (header_length > kMaxHeaderBytes) {
    throw Error(subject, "header length " + str(header_length) + " bytes exceeds the limit of " +
                             str(kMaxHeaderBytes) + " bytes (is this a safetensors file?)");
  }
  if (header_length > file_size - 8) {
    throw Error(subject, "truncated header: its length field says " + str(header_length) +
                             " bytes but the file ends " + str(file_size - 8) + " bytes after it");
  }
  if (header_length == 0) throw Error(subject, "has an empty header (length 0)");

  std::string header(header_length, '\0');
  file.read_at(8, header.data(), header.size());
  if (header[0] != '{') {
    throw Error(subject, "header does not start with '{' (found " + quote(header.substr(0, 1)) +
                             "): not a safetensors file");
  }
  // The JSON object must span the header, as in the reference: only spaces (the format's
  // padding) may follow it. nlohmann's lexer takes a NUL byte for the end of its input, so
  // "{...}\0anything" would parse as "{...}"; JSON allows no NUL anywhere, so any is refused.
  const std::size_t nul = header.find('\0');
  if (nul != std::string::npos) {
    throw Error(subject, "header holds a NUL byte at byte " + str(nul) +
                             " of the header: the JSON object must fill it, padded only with "
                             "trailing spaces");
  }
  const std::size_t last = header.find_last_not_of(' ');
  HeaderHandler handler;
  const bool parsed = nlohmann::json::sax_parse(header.substr(0, last + 1), &handler,
                                                nlohmann::json::input_format_t::json, true);
  if (!handler.error().empty()) throw Error(subject, handler.error());
  if (!parsed) throw Error(subject, "malformed JSON header");
  // A strict parse allows JSON's other whitespace (tab, CR, LF) after the object; the format
  // does not.
  if (header[last] != '}') {
    const std::size_t after = header.find_last_of('}', last) + 1;
    throw Error(subject, "header has byte " + quote(header.substr(after, 1)) + " at byte " +
                             str(after) +
                             " of the header, after its JSON object: only spaces may pad it");
  }

  Index index;
  index.entries = std::move(handler.entries());
  index.data_offset = 8 + header_length;
  const std::uint64_t buffer_length = file_size - index.data_offset;

  for (const SafetensorsEntry& entry : index.entries) {
    if (entry.end < entry.begin) {
      throw Error(subject, "tensor " + quote(entry.name) + " has data_offsets [" +
                               str(entry.begin) + ", " + str(entry.end) +
                               "] that end before they begin");
    }
  }
  std::stable_sort(index.entries.begin(), index.entries.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  std::uint64_t position = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& entry : index.entries) {
    const std::string offsets = "[" + str(entry.begin) + ", " + str(entry.end) + "]";
    if (entry.begin < position) {
      throw Error(subject, "tensor " + quote(entry.name) + " at data_offsets " + offsets +
                               " overlaps tensor " + quote(previous->name) + ", which ends at " +
                               str(position));
    }
    if (entry.begin > position) {
      throw Error(subject, "tensor " + quote(entry.name) + " at data_offsets " + offsets +
                               " leaves a gap of " + str(entry.begin - position) +
                               " bytes before it (tensors must be contiguous)");
    }
    const std::uint64_t bytes = tensor_bytes(entry, subject);
    if (entry.end - entry.begin != bytes) {
      throw Error(subject, "tensor " + quote(entry.name) + " of shape " +
                               shape_string(entry.shape) + " and dtype " + entry.dtype + " needs " +
                               str(bytes) + " bytes but its data_offsets " + offsets + " span " +
                               str(entry.end - entry.begin));
    }
    if (entry.end > buffer_length) {
      throw Error(subject, "tensor " + quote(entry.name) + " at data_offsets " + offsets +
                               " lies past the end of the file, whose data buffer holds " +
                               str(buffer_length) + " bytes");
    }
    position = entry.end;
    previous = &entry;
  }
  if (position != buffer_length) {
    throw Error(subject, "data buffer holds " + str(buffer_length) +
                             " bytes but its tensors cover " + str(position) + " (" +
                             str(buffer_length - position) + " bytes after the last tensor)");
  }
  return index;
}

std::string available_names(const std::vector<SafetensorsEntry>& entries,
                            const std::string& wanted) {
  // Names ending in the one asked for first (a missing "transformer." prefix, say).
  std::vector<std::string> names;
  for (const SafetensorsEntry& entry : entries) {
    if (entry.name.size() > wanted.size() && entry.name.ends_with("." + wanted)) {
      names.push_back(entry.name);
    }
  }
  if (!names.empty()) return "did you mean " + quote(names.front()) + "?";
  if (entries.empty()) return "the file holds no tensors";
  std::vector<std::string> all;
  for (const SafetensorsEntry& entry : entries) all.push_back(entry.name);
  std::sort(all.begin(), all.end());
  std::string text =
      "the file holds " + str(all.size()) + (all.size() == 1 ? " tensor: " : " tensors: ");
  for (std::size_t i = 0; i < all.size() && i < 4; ++i) text += (i ? ", " : "") + quote(all[i]);
  if (all.size() > 4) text += ", ...";
  return text;
}

// Where tensor `name` lies in the file and what reading it produces: the one parse that the
// peek (inspect_safetensors_tensor) and the reader share.
struct Located {
  TensorInfo info;
  std::uint64_t offset = 0;      // of its data in the file
  std::uint64_t file_bytes = 0;  // of its data in the file
};

Located locate_entry(const Index& index, const SafetensorsEntry& entry,
                     const std::string& subject) {
  // The subject of every later error about this tensor: kept to one printable line.
  Located located;
  located.info.name = subject + ":" + io::printable_name(entry.name);
  // Kept as stored: F16 and BF16 stay 16-bit in memory; the kernels widen them as they read.
  if (entry.dtype == "F32") {
    located.info.dtype = DType::kF32;
  } else if (entry.dtype == "F16") {
    located.info.dtype = DType::kF16;
  } else if (entry.dtype == "BF16") {
    located.info.dtype = DType::kBF16;
  } else if (entry.dtype == "F64") {
    located.info.dtype = DType::kF64;
  } else if (entry.dtype == "BOOL") {
    located.info.dtype = DType::kBool;
  } else {
    throw Error(located.info.name,
                "has dtype " + entry.dtype + ", which is not supported; " + kSupported);
  }
  located.info.shape = entry.shape;
  located.offset = index.data_offset + entry.begin;
  located.file_bytes = entry.end - entry.begin;
  // read_index has checked that the data span matches dtype and shape: the tensor takes the
  // span itself in memory.
  located.info.bytes = located.file_bytes;
  return located;
}

Located locate_tensor(const InputFile& file, const std::string& subject, const std::string& name) {
  const Index index = read_index(file, subject);
  const auto found = std::find_if(index.entries.begin(), index.entries.end(),
                                  [&](const SafetensorsEntry& e) { return e.name == name; });
  if (found == index.entries.end()) {
    throw Error(subject,
                "has no tensor named " + quote(name) + "; " + available_names(index.entries, name));
  }
  return locate_entry(index, *found, subject);
}

Tensor read_located(const InputFile& file, const Located& located) {
  const TensorInfo& info = located.info;
  Tensor tensor;
  try {
    tensor = Tensor(info.dtype, info.shape, info.name);
  } catch (const core::OutOfMemory& e) {
    throw Error(info.name, "out of memory reading " + e.allocation());
  }
  const std::uint64_t bytes = located.file_bytes;
  if (bytes > 0) file.read_at(located.offset, tensor.data(), bytes);
  if (info.dtype == DType::kBool) {
    const auto* values = static_cast<const unsigned char*>(tensor.data());
    for (std::uint64_t i = 0; i < bytes; ++i) {
      if (values[i] > 1) {
        throw Error(info.name, "bool element " + str(i) + " holds the byte " + str(values[i]) +
                                   "; bool data must be 0 or 1");
      }
    }
  }
  return tensor;
}

}  // namespace

std::vector<SafetensorsEntry> list_safetensors(const std::filesystem::path& path) {
  const std::string subject = path.string();
  const InputFile file(path, subject);
  return read_index(file, subject).entries;
}

TensorInfo inspect_safetensors_tensor(const std::filesystem::path& path, const std::string& name) {
  const std::string subject = path.string();
  const InputFile file(path, subject);
  Located located = locate_tensor(file, subject, name);
  return std::move(located.info);
}

Tensor read_safetensors_tensor(const std::filesystem::path& path, const std::string& name) {
  const std::string subject = path.string();
  const InputFile file(path, subject);
  return read_located(file, locate_tensor(file, subject, name));
}

Tensor read_safetensors_tensor_rows(const std::filesystem::path& path, const std::string& name,
                                        std::span<const RowSpan> spans) {
  const std::string subject = path.string();
  const InputFile file(path, subject);
  const Located located = locate_tensor(file, subject, name);
  return io::read_row_spans(located.info, located.offset, spans,
                            [&](std::uint64_t offset, void* buffer, std::size_t count) {
                              file.read_at(offset, buffer, count);
                            });
}

std::vector<std::pair<std::string, Tensor>> read_safetensors(const std::filesystem::path& path) {
  const std::string subject = path.string();
  const InputFile file(path, subject);
  const Index index = read_index(file, subject);
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.reserve(index.entries.size());
  for (const SafetensorsEntry& entry : index.entries) {
    tensors.emplace_back(entry.name, read_located(file, locate_entry(index, entry, subject)));
  }
  return tensors;
}

}  // namespace qkv
