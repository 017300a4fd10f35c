// qkv.KVCache: decoding against cached keys and values.
#include "bindings.h"

namespace qkv::python {

void register_kv_cache(py::module_& /*m*/) {}

}  // namespace qkv::python
