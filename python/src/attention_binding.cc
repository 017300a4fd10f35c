// qkv._qkv.attention: the one call behind qkv.attention (python/qkv/_attention.py), which
// turns torch tensors, DLPack and __array__ objects into NumPy arrays and names the arguments.
#include <pybind11/stl.h>

#include <string>

#include "arrays.h"
#include "bindings.h"
#include "options.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"

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

// The gradients of Σ out∘grad_out: (dq, dk, dv, dsinks or None, kernel, compute dtype, whether
// they were bf16).
py::tuple attention_backward(const py::handle& q_in, const py::handle& k_in,
                             const py::handle& v_in, const py::handle& out_in,
                             const py::handle& lse_in, const py::handle& grad_out_in,
                             const py::dict& option_items) {
  ArrayKeeper keeper;
  const AttentionCallInputs call = attention_call_inputs(q_in, k_in, v_in, option_items, keeper);
  const TensorView out = view_of(out_in, "out", keeper);
  const TensorView lse = view_of(lse_in, "lse", keeper);
  const TensorView grad_out = view_of(grad_out_in, "grad_out", keeper);
  AttentionGradients g;
  {
    py::gil_scoped_release computing;
    g = qkv::attention_backward(call.q, call.k, call.v, out, lse, grad_out, call.options);
  }
  const bool bf16 = g.dq.dtype() == DType::kBF16;
  // NumPy has no bfloat16: bf16 gradients cross as float32 (exactly), and qkv.attention_backward
  // rounds them back for torch (the same bits).
  for (Tensor* t : {&g.dq, &g.dk, &g.dv, &g.dsinks}) {
    if (!t->empty() && t->dtype() == DType::kBF16) *t = t->to(DType::kF32);
  }
  py::object dsinks = g.dsinks.empty() ? py::none() : py::object(to_numpy(std::move(g.dsinks)));
  return py::make_tuple(to_numpy(std::move(g.dq)), to_numpy(std::move(g.dk)),
                        to_numpy(std::move(g.dv)), dsinks, g.kernel, dtype_name(g.compute),
                        bf16);
}

}  // namespace

void register_attention(py::module_& m) {
  m.def("attention", &attention, "See qkv.attention.");
  m.def("attention_backward", &attention_backward, "See qkv.attention_backward.");
  m.def("backward_kernel_names", &qkv::attention_backward_kernel_names,
        "The backward kernel list, fastest first, the reference last.");
  m.def("alibi_slopes", &qkv::alibi_slopes, py::arg("heads"),
        "The standard ALiBi slopes for `heads` query heads.");
  m.def("kernel_names", &qkv::attention_kernel_names,
        "The kernel list, fastest first, the reference last.");
}

}  // namespace qkv::python
