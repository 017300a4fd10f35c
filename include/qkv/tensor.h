// Tensors: a non-owning strided view and an owning, contiguous, 64-byte aligned tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace qkv {

// kBF16 (bfloat16) and kF16 (IEEE binary16) are storage types: kept as stored, widened to
// float32 in registers by the kernels that read them. kI32 and kI64 serve index tensors only
// (the sequence offsets of a packed batch); no kernel reads them as values.
enum class DType : std::uint8_t { kF32, kF64, kBool, kBF16, kF16, kI32, kI64 };

std::size_t dtype_size(DType dtype) noexcept;
// "float32", "float64", "bool", "bfloat16", "float16", "int32", "int64"
const char* dtype_name(DType dtype) noexcept;

using Shape = std::vector<std::int64_t>;

// Strides of a C-order (row-major) tensor of this shape, in elements.
Shape contiguous_strides(const Shape& shape);
// Number of elements; throws qkv::Error (subject `name`) if the product overflows int64.
std::int64_t shape_numel(const Shape& shape, const std::string& name = "tensor");
std::string shape_string(const Shape& shape);  // "[2, 4, 33, 64]"

// A read-only view of someone else's memory. Strides are in elements and may be zero
// (broadcast) or describe column blocks of a wider matrix (heads as views, not copies).
// `name` is the subject of any error about this tensor, e.g. the file it came from.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  Shape strides;
  std::string name;

  int rank() const noexcept { return static_cast<int>(shape.size()); }
  // dim(-1) is the last dimension.
  std::int64_t dim(int axis) const noexcept {
    return shape[static_cast<std::size_t>(axis < 0 ? axis + rank() : axis)];
  }
  std::int64_t numel() const noexcept;
  bool is_contiguous() const noexcept;
};

// A writable view; converts to a TensorView.
struct MutableTensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  Shape strides;
  std::string name;

  operator TensorView() const { return TensorView{data, dtype, shape, strides, name}; }
  int rank() const noexcept { return static_cast<int>(shape.size()); }
  std::int64_t numel() const noexcept;
};

// An owning, contiguous (C order), zero-initialised tensor.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape, std::string name = "tensor");

  bool empty() const noexcept { return !storage_; }
  DType dtype() const noexcept { return dtype_; }
  const Shape& shape() const noexcept { return shape_; }
  std::int64_t numel() const noexcept { return numel_; }
  std::size_t nbytes() const noexcept {
    return static_cast<std::size_t>(numel_) * dtype_size(dtype_);
  }
  const std::string& name() const noexcept { return name_; }

  void* data() noexcept { return storage_.get(); }
  const void* data() const noexcept { return storage_.get(); }
  template <typename T>
  T* data_as() noexcept {
    return static_cast<T*>(data());
  }
  template <typename T>
  const T* data_as() const noexcept {
    return static_cast<const T*>(data());
  }

  TensorView view() const;
  MutableTensorView mutable_view();

  // A copy converted to another dtype: between the real types (kF32, kF64, kBF16, kF16),
  // rounding to nearest even when narrowing; kBool to any of them as 0/1; the integer types
  // to and from the real ones by value (toward zero when narrowing to an integer).
  Tensor to(DType dtype) const;

  // Gives the same elements a new shape of the same size (C order); throws qkv::Error if the
  // sizes differ.
  void reshape(Shape shape);

 private:
  struct AlignedFree {
    // Nonzero: the memory is a mapping of this many bytes. (No default member initializer: the
    // deleter must be default-constructible while Tensor is still incomplete; unique_ptr
    // value-initialises it to 0.)
    std::size_t mapped_bytes;
    void operator()(std::byte* p) const noexcept;
  };
  std::unique_ptr<std::byte[], AlignedFree> storage_;
  DType dtype_ = DType::kF32;
  Shape shape_;
  std::int64_t numel_ = 0;
  std::string name_;
};

// Copies any view (any strides, any dtype) into a new contiguous tensor of `dtype`, rounding to
// nearest even when narrowing (as Tensor::to).
Tensor contiguous_copy(const TensorView& view, DType dtype);

}  // namespace qkv
