// qkv._qkv: the extension module under the Python package qkv (python/qkv/__init__.py).
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "qkv/error.h"

namespace qkv::python {

namespace {

// Created with PyErr_NewException so that their names read "qkv.Error" and "qkv.FileError", and
// so that FileError can have two bases.
PyObject* error_type = nullptr;
PyObject* file_error_type = nullptr;

// The library names an option it refuses by its C++ field (or, for the layer's kv heads, by the
// CLI's spelling); Python callers know these by their argument names (as the CLI maps subjects
// to its flags).
std::string python_subject(const std::string& subject) {
  if (subject == "mask") return "attn_mask";
  if (subject == "causal") return "is_causal";
  if (subject == "kv-heads") return "kv_heads";
  return subject;
}

// Text from the library as Python text: a file name that is not UTF-8 keeps its bytes as
// os.fsdecode would (surrogateescape), never a decoding error in place of the message.
py::str text_of(const std::string& text) {
  return py::reinterpret_steal<py::str>(PyUnicode_DecodeUTF8(
      text.data(), static_cast<Py_ssize_t>(text.size()), "surrogateescape"));
}

// Raises `type` with the library's one-line message, and its two parts as attributes.
void raise(PyObject* type, const std::string& library_subject, const std::string& problem) {
  const std::string subject = python_subject(library_subject);
  py::object error = py::reinterpret_borrow<py::object>(type)(text_of(subject + ": " + problem));
  error.attr("subject") = text_of(subject);
  error.attr("problem") = text_of(problem);
  PyErr_SetObject(type, error.ptr());
}

}  // namespace

void register_errors(py::module_& m) {
  error_type = PyErr_NewException("qkv.Error", PyExc_ValueError, nullptr);
  py::tuple file_bases = py::make_tuple(py::handle(error_type), py::handle(PyExc_OSError));
  file_error_type = PyErr_NewException("qkv.FileError", file_bases.ptr(), nullptr);
  if (error_type == nullptr || file_error_type == nullptr) throw py::error_already_set();
  m.attr("Error") = py::handle(error_type);
  m.attr("FileError") = py::handle(file_error_type);
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const FileProblem& e) {
      raise(file_error_type, e.subject, e.problem);
    } catch (const Error& e) {
      raise(error_type, e.subject(), e.problem());
    }
  });
}

}  // namespace qkv::python

PYBIND11_MODULE(_qkv, m) {
  m.doc() = "qkv's extension module; use the package qkv, which wraps it.";
  m.attr("__version__") = qkv::version();
  qkv::python::register_errors(m);
  qkv::python::register_attention(m);
  qkv::python::register_layer(m);
  qkv::python::register_explain(m);
  qkv::python::register_io(m);
  qkv::python::register_kv_cache(m);
  qkv::python::register_timing(m);
  qkv::python::register_ring(m);
}
