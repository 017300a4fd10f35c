// The parts of the extension module qkv._qkv, each registering its functions and classes; the
// Python layer (python/qkv/*.py) gives them their public signatures and docstrings.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "qkv/error.h"

namespace qkv::python {

namespace py = pybind11;

// A problem with a file the caller named (reading or writing it): raised as qkv.FileError, which
// is both a qkv.Error and an OSError. Bindings that touch files catch qkv::Error and rethrow it
// as this.
struct FileProblem {
  std::string subject;
  std::string problem;
};

// Runs `work` and turns a qkv::Error it throws into a FileProblem.
template <typename Work>
auto as_file_work(Work&& work) -> decltype(work()) {
  try {
    return work();
  } catch (const Error& e) {
    throw FileProblem{e.subject(), e.problem()};
  }
}

// A path argument (str, bytes or os.PathLike) as the file system's bytes (os.fsencode: a name
// that is not UTF-8 keeps its bytes). A path with a NUL byte, which the C library would cut
// short there, raises qkv::Error naming `name`, as does anything that is not a path.
inline std::string path_argument(const py::handle& path, const char* name) {
  py::object encoded;
  try {
    encoded = py::module_::import("os").attr("fsencode")(path);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    throw Error(name, "expected a str or os.PathLike path, got " +
                          py::type::of(path).attr("__name__").cast<std::string>());
  }
  std::string bytes = encoded.cast<std::string>();
  if (bytes.find('\0') != std::string::npos) throw Error(name, "contains a NUL byte");
  return bytes;
}

void register_errors(py::module_& m);
void register_attention(py::module_& m);
void register_layer(py::module_& m);
void register_explain(py::module_& m);
void register_io(py::module_& m);
void register_kv_cache(py::module_& m);
void register_timing(py::module_& m);
void register_ring(py::module_& m);

}  // namespace qkv::python
