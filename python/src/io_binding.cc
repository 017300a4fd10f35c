// qkv.read_npy, qkv.load_safetensors and friends: files in and out.
#include "bindings.h"

namespace qkv::python {

void register_io(py::module_& /*m*/) {}

}  // namespace qkv::python
