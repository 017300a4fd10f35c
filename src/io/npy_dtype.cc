// The dtypes of .npy files: what each reader accepts, and the message for everything else.
#include "io/npy_dtype.h"

#include <string>
#include <string_view>

#include "io/input_file.h"
#include "qkv/error.h"

namespace qkv::io {
namespace {

constexpr std::size_t kQuoteLimit = 40;
// What each reader takes, said in its refusals (indexed by NpyAccept).
constexpr const char* kSupported[] = {
    "qkv reads float32 ('<f4'), float64 ('<f8'), float16 ('<f2') and bool ('|b1')",
    "they must be int32 ('<i4') or int64 ('<i8'): save them with .astype(np.int32)"};

// A descr split as NumPy writes it: byte order ('<', '>', '|', '=' or none), kind, item size.
struct Descr {
  char order = '\0';
  char kind = '\0';
  std::string_view size;
};

Descr split_descr(std::string_view descr) {
  Descr d;
  if (!descr.empty() && std::string_view("<>|=").find(descr[0]) != std::string_view::npos) {
    d.order = descr[0];
    descr.remove_prefix(1);
  }
  if (!descr.empty()) {
    d.kind = descr[0];
    d.size = descr.substr(1);
  }
  return d;
}

// The dtype of a descr we accept; anything else throws with the most useful message we can give.
DType dtype_from_descr(const std::string& descr, const std::string& subject) {
  if (descr == "<f4") return DType::kF32;
  if (descr == "<f8") return DType::kF64;
  if (descr == "<f2") return DType::kF16;  // kept as stored: the kernels widen it as they read
  // Byte order means nothing for one byte: NumPy writes '|b1', other writers may not.
  if (descr == "|b1" || descr == "<b1" || descr == ">b1" || descr == "=b1" || descr == "b1" ||
      descr == "?") {
    return DType::kBool;
  }

  const auto [order, kind, size] = split_descr(descr);
  const std::string shown = quote_npy_text(descr);
  std::string problem;
  switch (kind) {
    case 'f':
      // These two have a one-call fix, which says more than the list of what we read.
      if ((size == "2" || size == "4" || size == "8") && order == '>') {
        throw Error(subject, "big-endian data (" + shown +
                                 ") is not supported; convert with .astype('<f" +
                                 std::string(size) + "')");
      }
      if (size == "2" || size == "4" || size == "8") {
        throw Error(subject, "dtype " + shown + " does not state little-endian byte order; " +
                                 "save it as '<f" + std::string(size) + "'");
      }
      problem = "floating-point dtype " + shown + " is not supported";
      break;
    case 'i':
    case 'u':
      problem = "integer dtype " + shown + " is not supported";
      break;
    case 'c':
      problem = "complex dtype " + shown + " is not supported";
      break;
    case 'O':
      problem = "object arrays (" + shown + ") are not supported";
      break;
    case 'U':
    case 'S':
    case 'a':
      problem = "string dtype " + shown + " is not supported";
      break;
    case 'V':
      problem = "structured or void dtype " + shown + " is not supported";
      break;
    case 'M':
    case 'm':
      problem = "datetime dtype " + shown + " is not supported";
      break;
    case 'b':
      problem = "bool dtype " + shown + " must have 1-byte items";
      break;
    default:
      problem = "unsupported dtype " + shown;
      break;
  }
  throw Error(subject, problem + "; " + kSupported[0] +
                           (kind == 'i' || kind == 'u'
                                ? " (integers only as the sequence offsets of a packed batch)"
                                : ""));
}

// The dtype of sequence offsets: int32 or int64, little-endian; anything else (float offsets
// above all, which np.cumsum of float lengths gives) is refused, naming the dtype and the fix.
DType offsets_dtype_from_descr(const std::string& descr, const std::string& subject) {
  if (descr == "<i4") return DType::kI32;
  if (descr == "<i8") return DType::kI64;
  const auto [order, kind, size] = split_descr(descr);
  const std::string shown = quote_npy_text(descr);
  if (kind == 'i' && (size == "4" || size == "8")) {
    if (order == '>') {
      throw Error(subject, "big-endian data (" + shown +
                               ") is not supported; convert with .astype('<i" + std::string(size) +
                               "')");
    }
    throw Error(subject, "dtype " + shown + " does not state little-endian byte order; " +
                             "save it as '<i" + std::string(size) + "'");
  }
  throw Error(subject, "dtype " + shown + " cannot hold sequence offsets; " + kSupported[1]);
}

}  // namespace

std::string quote_npy_text(std::string_view text) {
  const char delimiter =
      text.find('\'') != std::string_view::npos && text.find('"') == std::string_view::npos ? '"'
                                                                                            : '\'';
  return quote_from_file(text, delimiter, kQuoteLimit);
}

const char* npy_supported(NpyAccept accept) noexcept {
  return kSupported[accept == NpyAccept::kOffsets ? 1 : 0];
}

DType npy_dtype_from_descr(const std::string& descr, const std::string& subject, NpyAccept accept) {
  return accept == NpyAccept::kOffsets ? offsets_dtype_from_descr(descr, subject)
                                       : dtype_from_descr(descr, subject);
}

const char* npy_descr_of(DType dtype) noexcept {
  switch (dtype) {
    case DType::kF32:
      return "<f4";
    case DType::kF64:
      return "<f8";
    case DType::kBool:
      return "|b1";
    case DType::kF16:
      return "<f2";
    case DType::kI32:
      return "<i4";
    case DType::kI64:
      return "<i8";
    case DType::kBF16:
      return "?";  // NumPy has no bfloat16
  }
  return "?";
}

}  // namespace qkv::io
