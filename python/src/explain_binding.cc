// qkv.explain: the walk-through and the attention page.
#include "bindings.h"

namespace qkv::python {

void register_explain(py::module_& /*m*/) {}

}  // namespace qkv::python
