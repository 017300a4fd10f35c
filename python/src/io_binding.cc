// qkv.read_npy, qkv.read_tensor, qkv.load_safetensors and qkv.write_npy: the library's readers
// and atomic writer; paths are str, bytes or os.PathLike (path_argument). Every problem with a
// file is a qkv.FileError with the library's one-line message.
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "qkv/io.h"

namespace qkv::python {

namespace {

// NumPy has no bfloat16: such a tensor comes out as float32, which holds every bfloat16 exactly.
py::array numpy_of(Tensor&& tensor) {
  if (tensor.dtype() == DType::kBF16) return to_numpy(tensor.to(DType::kF32));
  return to_numpy(std::move(tensor));
}

// One tensor through `reader` (read_npy or read_tensor) from the path argument `name`.
py::array read_call(const py::handle& path_in, const char* name,
                    Tensor (*reader)(const std::string&)) {
  const std::string path = path_argument(path_in, name);
  Tensor tensor;
  {
    py::gil_scoped_release reading;
    tensor = as_file_work([&] { return reader(path); });
  }
  return numpy_of(std::move(tensor));
}

// read_tensor_rows: `rows` is a list of (first, last) pairs, checked in Python (qkv/_io.py).
py::array read_rows_call(const py::handle& spec_in,
                         const std::vector<std::pair<std::int64_t, std::int64_t>>& rows) {
  const std::string spec = path_argument(spec_in, "spec");
  std::vector<RowSpan> spans;
  for (const auto& [first, last] : rows) spans.push_back({first, last});
  Tensor tensor;
  {
    py::gil_scoped_release reading;
    tensor = as_file_work([&] { return read_tensor_rows(spec, spans); });
  }
  return numpy_of(std::move(tensor));
}

py::dict load_safetensors_call(const py::handle& path_in) {
  const std::string path = path_argument(path_in, "path");
  std::vector<std::pair<std::string, Tensor>> tensors;
  {
    py::gil_scoped_release reading;
    tensors = as_file_work([&] { return read_safetensors(path); });
  }
  py::dict result;
  for (auto& [name, tensor] : tensors) result[py::str(name)] = numpy_of(std::move(tensor));
  return result;
}

// The dtype a file gets by default: the array's own, bfloat16 (which .npy cannot hold) widened
// to float32.
DType file_dtype(const TensorView& view) {
  return view.dtype == DType::kBF16 ? DType::kF32 : view.dtype;
}

void write_npy_call(const py::handle& path_in, const py::handle& array,
                    const std::optional<std::string>& dtype) {
  const std::string path = path_argument(path_in, "path");
  ArrayKeeper keeper;
  TensorView view = view_of(array, "array", keeper);
  view.name = path;
  const DType stored = dtype ? parse_dtype(*dtype, "dtype") : file_dtype(view);
  if (stored == DType::kBF16) {
    throw Error("dtype", "a .npy file cannot hold bfloat16 (NumPy has no such dtype)");
  }
  py::gil_scoped_release writing;
  as_file_work([&] { write_npy(path, view, stored); });
}

}  // namespace

void register_io(py::module_& m) {
  m.def(
      "read_npy",
      [](const py::handle& path) {
        return read_call(path, "path", [](const std::string& p) { return read_npy(p); });
      },
      "See qkv.read_npy.");
  m.def(
      "read_tensor",
      [](const py::handle& spec) { return read_call(spec, "spec", &read_tensor); },
      "See qkv.read_tensor.");
  m.def("read_tensor_rows", &read_rows_call, "See qkv.read_tensor.");
  m.def("load_safetensors", &load_safetensors_call, "See qkv.load_safetensors.");
  m.def("write_npy", &write_npy_call, "See qkv.write_npy.");
}

}  // namespace qkv::python
