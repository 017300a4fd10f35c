// Between Python's arrays and qkv's tensors: NumPy arrays (and what python/qkv/_arrays.py made
// of torch tensors, __array__ and DLPack objects) in as views of their own memory, qkv's tensors
// out as NumPy arrays that own them. Nothing is copied on either side except an input qkv cannot
// read in place (a dtype it does not take, a misaligned or byte-swapped buffer, a negative
// stride), which is copied once into a form it can.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <optional>
#include <string>
#include <vector>

#include "qkv/tensor.h"

namespace qkv::python {

namespace py = pybind11;

// Keeps alive, for the length of one call, the arrays the views point into.
class ArrayKeeper {
 public:
  void hold(py::object object) { held_.push_back(std::move(object)); }

 private:
  std::vector<py::object> held_;
};

// A view of `object`'s memory, named `name` in any error. `object` is a NumPy array of float32,
// float64, float16, bool, int32 or int64 (offsets), or the pair ("bfloat16", uint16 array) the
// Python layer makes of a torch.bfloat16 tensor; float128 is converted to float64. Anything else
// raises qkv::Error naming `name` (validation then says which dtypes each input takes).
TensorView view_of(const py::handle& object, const std::string& name, ArrayKeeper& keeper);

std::optional<TensorView> optional_view_of(const py::handle& object, const std::string& name,
                                           ArrayKeeper& keeper);

// A NumPy array that owns `tensor` (moved, not copied).
py::array to_numpy(Tensor&& tensor);

// "float32", "float64", "float16", "bfloat16" (and the short forms f32, f64, f16, bf16, fp32, ...)
// to a DType; anything else raises qkv::Error naming `subject`.
DType parse_dtype(const std::string& text, const std::string& subject);

// The NumPy dtype of a real DType (bfloat16, which NumPy lacks, raises).
py::dtype numpy_dtype(DType dtype);

}  // namespace qkv::python
