// Timing calls in C++, without Python in the loop (qkv.bench).
#include "bindings.h"

namespace qkv::python {

void register_timing(py::module_& /*m*/) {}

}  // namespace qkv::python
