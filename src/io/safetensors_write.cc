// Writing .safetensors: an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and data_offsets (padded with spaces to a multiple of 8 bytes, as the
// reference writer does), then the tensors' bytes back to back, in the order given.
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv {
namespace {

const char* safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kBool: return "BOOL";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
  }
  return "F32";
}

}  // namespace

std::vector<char> encode_safetensors(
    const std::vector<std::pair<std::string, TensorView>>& tensors) {
  // nlohmann::ordered_json keeps the header in the order of the data, which readers do not need
  // but a person reading the header does.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::set<std::string> seen;
  std::uint64_t offset = 0;
  std::vector<Tensor> contiguous(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, view] = tensors[i];
    if (name.empty() || name == "__metadata__") {
      throw Error("safetensors", "a tensor cannot be named \"" + name + "\"");
    }
    if (!seen.insert(name).second) throw Error(name, "is given twice for one .safetensors file");
    const std::uint64_t bytes = static_cast<std::uint64_t>(view.numel()) * dtype_size(view.dtype);
    header[name] = {{"dtype", safetensors_dtype(view.dtype)},
                    {"shape", view.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    if (!view.is_contiguous()) contiguous[i] = contiguous_copy(view, view.dtype);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<char> out(8 + text.size() + offset);
  const std::uint64_t length = text.size();
  for (std::size_t b = 0; b < 8; ++b) out[b] = static_cast<char>((length >> (8 * b)) & 0xff);
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::size_t at = 8 + text.size();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& view = tensors[i].second;
    const void* data = contiguous[i].empty() ? view.data : contiguous[i].data();
    const std::size_t bytes = static_cast<std::size_t>(view.numel()) * dtype_size(view.dtype);
    if (bytes > 0) std::memcpy(out.data() + at, data, bytes);
    at += bytes;
  }
  return out;
}

}  // namespace qkv
