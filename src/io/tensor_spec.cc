// Tensor arguments as the command line writes them: "FILE.npy" (any path without a marker),
// "FILE.safetensors:NAME" and "FILE.npz:NAME". The one place a spec is taken apart, so that
// read_tensor and inspect_tensor (and through them every command) agree on what it names.
#include <string>

#include "io/row_spans.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv {
namespace {

enum class Format { kNpy, kSafetensors, kNpz };

struct Spec {
  Format format = Format::kNpy;
  std::string path;
  std::string name;  // empty for an .npy file
};

struct Container {
  Format format;
  const char* suffix;
};

constexpr Container kContainers[] = {{Format::kSafetensors, ".safetensors"},
                                     {Format::kNpz, ".npz"}};

Spec parse_spec(const std::string& spec) {
  // The first "SUFFIX:" of either kind ends the file name: a tensor name may hold anything.
  const Container* container = nullptr;
  std::size_t at = std::string::npos;
  for (const Container& c : kContainers) {
    const std::size_t found = spec.find(std::string(c.suffix) + ":");
    if (found < at) {
      at = found;
      container = &c;
    }
  }
  if (container != nullptr) {
    const std::size_t name_at = at + std::string(container->suffix).size() + 1;
    Spec parts{container->format, spec.substr(0, name_at - 1), spec.substr(name_at)};
    if (parts.name.empty()) {
      throw Error(spec, std::string("names no tensor; write FILE") + container->suffix + ":NAME");
    }
    return parts;
  }
  if (spec.ends_with(".safetensors")) {
    throw Error(spec, "is a safetensors file: name the tensor as " + spec + ":NAME");
  }
  if (spec.ends_with(".npz")) {
    throw Error(spec, "is an .npz archive: name the array as " + spec + ":NAME");
  }
  return Spec{Format::kNpy, spec, ""};
}

}  // namespace

Tensor read_tensor(const std::string& spec) {
  const Spec parts = parse_spec(spec);
  switch (parts.format) {
    case Format::kSafetensors:
      return read_safetensors_tensor(parts.path, parts.name);
    case Format::kNpz:
      return read_npz_tensor(parts.path, parts.name);
    case Format::kNpy:
      break;
  }
  return read_npy(parts.path);
}

TensorInfo inspect_tensor(const std::string& spec) {
  const Spec parts = parse_spec(spec);
  switch (parts.format) {
    case Format::kSafetensors:
      return inspect_safetensors_tensor(parts.path, parts.name);
    case Format::kNpz:
      return inspect_npz_tensor(parts.path, parts.name);
    case Format::kNpy:
      break;
  }
  return inspect_npy(parts.path);
}

Tensor read_tensor_rows(const std::string& spec, std::span<const RowSpan> spans) {
  const Spec parts = parse_spec(spec);
  switch (parts.format) {
    case Format::kSafetensors:
      return read_safetensors_tensor_rows(parts.path, parts.name, spans);
    case Format::kNpz:
      return read_npz_tensor_rows(parts.path, parts.name, spans);
    case Format::kNpy:
      break;
  }
  return read_npy_rows(parts.path, spans);
}

}  // namespace qkv
