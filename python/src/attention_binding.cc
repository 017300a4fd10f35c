// qkv._qkv.attention: the one call behind qkv.attention (python/qkv/_attention.py), which
// turns torch tensors, DLPack and __array__ objects into NumPy arrays and names the arguments.
#include <pybind11/stl.h>

#include <string>

#include "arrays.h"
#include "bindings.h"
#include "options.h"
#include "qkv/attention.h"

namespace qkv::python {

namespace {

py::tuple attention(const py::handle& q_in, const py::handle& k_in, const py::handle& v_in,
                    const py::dict& option_items) {
  ArrayKeeper keeper;
  const AttentionCallInputs call = attention_call_inputs(q_in, k_in, v_in, option_items, keeper);
  const AttentionOptions& options = call.options;
  AttentionResult result;
  {
    py::gil_scoped_release computing;
    result = qkv::attention(call.q, call.k, call.v, options);
  }
  py::object lse =
      options.return_lse ? py::object(to_numpy(std::move(result.lse))) : py::none();
  py::object weights =
      options.return_weights ? py::object(to_numpy(std::move(result.weights))) : py::none();
  return py::make_tuple(to_numpy(std::move(result.out)), lse, weights, result.kernel,
                        dtype_name(result.compute));
}

}  // namespace

void register_attention(py::module_& m) {
  m.def("attention", &attention, "See qkv.attention.");
  m.def("alibi_slopes", &qkv::alibi_slopes, py::arg("heads"),
        "The standard ALiBi slopes for `heads` query heads.");
  m.def("kernel_names", &qkv::attention_kernel_names,
        "The kernel list, fastest first, the reference last.");
}

}  // namespace qkv::python
