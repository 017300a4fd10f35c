#include "arrays.h"

#include <cstdint>
#include <memory>
#include <utility>

#include "qkv/error.h"

namespace qkv::python {

namespace {

// The DType NumPy's dtype has in qkv, if qkv reads it as stored.
std::optional<DType> stored_dtype(const py::dtype& dtype) {
  if (dtype.kind() == 'f') {
    if (dtype.itemsize() == 4) return DType::kF32;
    if (dtype.itemsize() == 8) return DType::kF64;
    if (dtype.itemsize() == 2) return DType::kF16;
    return std::nullopt;
  }
  if (dtype.kind() == 'b' && dtype.itemsize() == 1) return DType::kBool;
  if (dtype.kind() == 'i' && dtype.itemsize() == 4) return DType::kI32;
  if (dtype.kind() == 'i' && dtype.itemsize() == 8) return DType::kI64;
  return std::nullopt;
}

bool readable_in_place(const py::array& array) {
  const int flags = py::detail::array_proxy(array.ptr())->flags;
  if ((flags & py::detail::npy_api::NPY_ARRAY_ALIGNED_) == 0) return false;
  if (!array.dtype().attr("isnative").cast<bool>()) return false;
  for (py::ssize_t axis = 0; axis < array.ndim(); ++axis) {
    if (array.strides(axis) < 0 || array.strides(axis) % array.itemsize() != 0) return false;
  }
  return true;
}

TensorView view_of_array(const py::array& array, DType dtype, const std::string& name) {
  TensorView view;
  view.data = array.data();
  view.dtype = dtype;
  view.name = name;
  const py::ssize_t rank = array.ndim();
  view.shape.resize(static_cast<std::size_t>(rank));
  view.strides.resize(static_cast<std::size_t>(rank));
  for (py::ssize_t axis = 0; axis < rank; ++axis) {
    const auto a = static_cast<std::size_t>(axis);
    view.shape[a] = static_cast<std::int64_t>(array.shape(axis));
    view.strides[a] = static_cast<std::int64_t>(array.strides(axis) / array.itemsize());
  }
  return view;
}

// A copy qkv can read in place: C order, aligned, native byte order.
py::array readable_copy(const py::array& array, const py::object& dtype) {
  return py::module_::import("numpy").attr("array")(array, py::arg("dtype") = dtype,
                                                    py::arg("order") = "C");
}

}  // namespace

TensorView view_of(const py::handle& object, const std::string& name, ArrayKeeper& keeper) {
  if (py::isinstance<py::tuple>(object)) {
    const auto pair = py::reinterpret_borrow<py::tuple>(object);
    if (pair.size() != 2 || !py::isinstance<py::str>(pair[0]) ||
        pair[0].cast<std::string>() != "bfloat16" || !py::isinstance<py::array>(pair[1])) {
      throw Error(name, "expected an array, got a tuple");
    }
    auto bits = py::reinterpret_borrow<py::array>(pair[1]);
    if (bits.dtype().kind() != 'u' || bits.itemsize() != 2) {
      throw Error(name, "bfloat16 data must come as uint16 bits");
    }
    if (!readable_in_place(bits)) {
      bits = readable_copy(bits, py::dtype("uint16"));
      keeper.hold(bits);
    }
    return view_of_array(bits, DType::kBF16, name);
  }
  if (!py::isinstance<py::array>(object)) {
    throw Error(name, "expected an array, got " +
                          py::type::of(object).attr("__name__").cast<std::string>());
  }
  auto array = py::reinterpret_borrow<py::array>(object);
  std::optional<DType> dtype = stored_dtype(array.dtype());
  if (!dtype) {
    if (array.dtype().kind() != 'f') {
      throw Error(name, "dtype " + py::str(array.dtype()).cast<std::string>() +
                            " is not an array dtype qkv reads (float32, float64, float16, "
                            "bool; int32 or int64 sequence offsets)");
    }
    array = readable_copy(array, py::dtype("float64"));
    dtype = DType::kF64;
    keeper.hold(array);
  } else if (!readable_in_place(array)) {
    array = readable_copy(array, array.dtype().attr("newbyteorder")("="));
    keeper.hold(array);
  }
  return view_of_array(array, *dtype, name);
}

std::optional<TensorView> optional_view_of(const py::handle& object, const std::string& name,
                                           ArrayKeeper& keeper) {
  if (object.is_none()) return std::nullopt;
  return view_of(object, name, keeper);
}

py::dtype numpy_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32: return py::dtype("float32");
    case DType::kF64: return py::dtype("float64");
    case DType::kF16: return py::dtype("float16");
    case DType::kBool: return py::dtype("bool");
    case DType::kI32: return py::dtype("int32");
    case DType::kI64: return py::dtype("int64");
    case DType::kBF16: break;
  }
  throw Error("dtype", "bfloat16 has no NumPy dtype");
}

py::array to_numpy(Tensor&& tensor) {
  const py::dtype dtype = numpy_dtype(tensor.dtype());
  std::vector<py::ssize_t> shape(tensor.shape().begin(), tensor.shape().end());
  if (tensor.numel() == 0 || tensor.empty()) return py::array(dtype, shape);
  auto* owner = new Tensor(std::move(tensor));
  py::capsule base(owner, [](void* p) { delete static_cast<Tensor*>(p); });
  return py::array(dtype, shape, owner->data(), base);
}

DType parse_dtype(const std::string& text, const std::string& subject) {
  if (text == "float32" || text == "f32" || text == "fp32") return DType::kF32;
  if (text == "float64" || text == "f64" || text == "fp64" || text == "double") return DType::kF64;
  if (text == "float16" || text == "f16" || text == "fp16" || text == "half") return DType::kF16;
  if (text == "bfloat16" || text == "bf16") return DType::kBF16;
  throw Error(subject, "unknown dtype '" + text +
                           "' (expected float32, float64, float16 or bfloat16)");
}

}  // namespace qkv::python
