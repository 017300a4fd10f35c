#include "qkv/tensor.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <sstream>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/format_bytes.h"
#include "core/half.h"
#include "core/out_of_memory.h"
#include "qkv/error.h"

namespace qkv {
namespace {

constexpr std::size_t kAlignment = 64;  // a cache line and an AVX-512 register

double read_as_double(const void* data, DType dtype, std::int64_t at) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<double>(static_cast<const float*>(data)[at]);
    case DType::kF64:
      return static_cast<const double*>(data)[at];
    case DType::kBool:
      return static_cast<const bool*>(data)[at] ? 1.0 : 0.0;
    case DType::kBF16:
      return static_cast<double>(core::bf16_to_float(static_cast<const std::uint16_t*>(data)[at]));
    case DType::kF16:
      return static_cast<double>(core::f16_to_float(static_cast<const std::uint16_t*>(data)[at]));
    case DType::kI32:
      return static_cast<double>(static_cast<const std::int32_t*>(data)[at]);
    case DType::kI64:
      return static_cast<double>(static_cast<const std::int64_t*>(data)[at]);
  }
  return 0.0;
}

void write_from_double(void* data, DType dtype, std::int64_t at, double value) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(data)[at] = static_cast<float>(value);
      break;
    case DType::kF64:
      static_cast<double*>(data)[at] = value;
      break;
    case DType::kBool:
      static_cast<bool*>(data)[at] = value != 0.0;
      break;
    case DType::kBF16:
      static_cast<std::uint16_t*>(data)[at] = core::float_to_bf16(core::narrow_to_odd(value));
      break;
    case DType::kF16:
      static_cast<std::uint16_t*>(data)[at] = core::float_to_f16(core::narrow_to_odd(value));
      break;
    // Toward zero, saturating; NaN becomes 0 (a plain cast would be undefined for both).
    case DType::kI32:
      static_cast<std::int32_t*>(data)[at] =
          std::isnan(value)
              ? 0
              : static_cast<std::int32_t>(std::clamp(value, -2147483648.0, 2147483647.0));
      break;
    case DType::kI64:
      static_cast<std::int64_t*>(data)[at] =
          std::isnan(value)                 ? 0
          : value >= 9223372036854775807.0  ? std::numeric_limits<std::int64_t>::max()
          : value <= -9223372036854775808.0 ? std::numeric_limits<std::int64_t>::min()
                                            : static_cast<std::int64_t>(value);
      break;
  }
}

std::int64_t count_elements(const Shape& shape) noexcept {
  std::int64_t n = 1;
  for (std::int64_t extent : shape) n *= extent;
  return n;
}

bool strides_are_contiguous(const Shape& shape, const Shape& strides) {
  std::int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

}  // namespace

std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kBool:
      return 1;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
  }
  return 0;
}

const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kF64:
      return "float64";
    case DType::kBool:
      return "bool";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
  }
  return "?";
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  std::int64_t stride = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

std::int64_t shape_numel(const Shape& shape, const std::string& name) {
  std::int64_t n = 1;
  for (std::int64_t extent : shape) {
    if (extent < 0) throw Error(name, "negative dimension in shape " + shape_string(shape));
    if (extent != 0 && n > std::numeric_limits<std::int64_t>::max() / extent) {
      throw Error(name, "shape " + shape_string(shape) + " has too many elements");
    }
    n *= extent;
  }
  return n;
}

std::string shape_string(const Shape& shape) {
  std::ostringstream s;
  s << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << ']';
  return s.str();
}

std::int64_t TensorView::numel() const noexcept { return count_elements(shape); }
bool TensorView::is_contiguous() const noexcept { return strides_are_contiguous(shape, strides); }
std::int64_t MutableTensorView::numel() const noexcept { return count_elements(shape); }

void Tensor::AlignedFree::operator()(std::byte* p) const noexcept {
#if defined(__linux__)
  if (mapped_bytes != 0) {
    ::munmap(p, mapped_bytes);
    return;
  }
#endif
  ::operator delete[](p, std::align_val_t(kAlignment));
}

namespace {

// Tensors of at least this many bytes are fresh anonymous mappings: the kernel hands them out
// zeroed and faults their pages in where they are first written (by the threads of the kernel
// that fills them, in parallel), where new + memset zeroed them on one thread first, page fault
// by page fault: 9 % of a float32 backward at n = 2048, d = 128 (24 MiB of gradients) on one
// thread. Transparent huge pages, where the system allows them on request, take 512 faults in
// one.
constexpr std::size_t kMapAtLeast = std::size_t{4} << 20;

std::byte* map_zeroed(std::size_t bytes) noexcept {
#if defined(__linux__)
  void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return nullptr;
#if defined(MADV_HUGEPAGE)
  ::madvise(memory, bytes, MADV_HUGEPAGE);  // advice only: refused, the pages stay small
#endif
  return static_cast<std::byte*>(memory);
#else
  (void)bytes;
  return nullptr;
#endif
}

}  // namespace

Tensor::Tensor(DType dtype, Shape shape, std::string name)
    : dtype_(dtype), shape_(std::move(shape)), name_(std::move(name)) {
  numel_ = shape_numel(shape_, name_);
  const auto limit = std::numeric_limits<std::size_t>::max() / 2 / dtype_size(dtype_);
  if (static_cast<std::uint64_t>(numel_) > limit) {
    throw Error(name_, "shape " + shape_string(shape_) + " is too large to allocate");
  }
  // At least one byte, so that an empty tensor still has a distinct, valid address.
  const std::size_t bytes = std::max<std::size_t>(nbytes(), 1);
  const auto out_of_memory = [&] {
    return core::OutOfMemory(name_,
                             core::format_bytes_exact(bytes) + " for a " + dtype_name(dtype_) +
                                 " tensor " + shape_string(shape_),
                             bytes);
  };
#if defined(__linux__)
  if (bytes >= kMapAtLeast) {
    std::byte* mapped = map_zeroed(bytes);
    if (mapped == nullptr) throw out_of_memory();
    storage_ = std::unique_ptr<std::byte[], AlignedFree>(mapped, AlignedFree{bytes});
    return;
  }
#endif
  std::byte* memory = nullptr;
  try {
    memory = new (std::align_val_t(kAlignment)) std::byte[bytes];
  } catch (const std::bad_alloc&) {
    throw out_of_memory();
  }
  std::memset(memory, 0, bytes);
  storage_.reset(memory);
}

TensorView Tensor::view() const {
  return TensorView{data(), dtype_, shape_, contiguous_strides(shape_), name_};
}

MutableTensorView Tensor::mutable_view() {
  return MutableTensorView{data(), dtype_, shape_, contiguous_strides(shape_), name_};
}

Tensor Tensor::to(DType dtype) const { return contiguous_copy(view(), dtype); }

void Tensor::reshape(Shape shape) {
  if (shape_numel(shape, name_) != numel_) {
    throw Error(name_, "cannot reshape " + shape_string(shape_) + " to " + shape_string(shape));
  }
  shape_ = std::move(shape);
}

Tensor contiguous_copy(const TensorView& view, DType dtype) {
  Tensor copy(dtype, view.shape, view.name);
  if (view.dtype == dtype && view.is_contiguous()) {
    if (copy.nbytes() > 0) std::memcpy(copy.data(), view.data, copy.nbytes());
    return copy;
  }
  // Walk the view in C order with an odometer over its strided index.
  const std::size_t rank = view.shape.size();
  std::vector<std::int64_t> index(rank, 0);
  std::int64_t offset = 0;
  for (std::int64_t flat = 0; flat < copy.numel(); ++flat) {
    write_from_double(copy.data(), dtype, flat, read_as_double(view.data, view.dtype, offset));
    for (std::size_t axis = rank; axis-- > 0;) {
      offset += view.strides[axis];
      if (++index[axis] < view.shape[axis]) break;
      offset -= view.strides[axis] * view.shape[axis];
      index[axis] = 0;
    }
  }
  return copy;
}

}  // namespace qkv
