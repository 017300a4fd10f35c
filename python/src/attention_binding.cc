// qkv._qkv.attention: the one call behind qkv.attention (python/qkv/_attention.py), which
// turns torch tensors, DLPack and __array__ objects into NumPy arrays and names the arguments.
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "options.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"

namespace qkv::python {

namespace {

// An uninitialised NumPy array of `shape` whose memory runs in `order` (axes from outermost
// to innermost), returned as a view in the shape's own axis order.
py::array empty_in_order(DType dtype, const Shape& shape, const std::vector<std::size_t>& order) {
  std::vector<py::ssize_t> stored(shape.size());
  for (std::size_t a = 0; a < order.size(); ++a) stored[a] = shape[order[a]];
  py::array buffer(numpy_dtype(dtype), stored);
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = static_cast<py::ssize_t>(dtype_size(dtype));
  for (std::size_t a = order.size(); a-- > 0;) {
    strides[order[a]] = stride;
    stride *= std::max<py::ssize_t>(stored[a], 1);
  }
  return py::array(buffer.dtype(), std::vector<py::ssize_t>(shape.begin(), shape.end()), strides,
                   buffer.data(), buffer);
}

MutableTensorView writable_view(py::array& array, DType dtype, const std::string& name) {
  MutableTensorView view{array.mutable_data(), dtype, {}, {}, name};
  for (py::ssize_t axis = 0; axis < array.ndim(); ++axis) {
    view.shape.push_back(static_cast<std::int64_t>(array.shape(axis)));
    view.strides.push_back(static_cast<std::int64_t>(array.strides(axis) / array.itemsize()));
  }
  return view;
}

// The output of a plain call (float32 or float64, no weights, no byte budget) in memory qkv
// does not zero first: NumPy's own, which its allocator hands back warm call after call, where
// a fresh zeroed tensor of several MiB is faulted in page by page each time (5 % of a call at
// B = 32, H = 12, N = 128, D = 32). A query whose heads are interleaved in memory (torch's
// q.transpose(1, 2) of [B, N, H, D], as transformers makes it) gets an output laid out the same
// way, as torch's scaled_dot_product_attention gives it, so that the model's
// out.transpose(1, 2).contiguous() copies nothing. Returns (out, lse or None, weights = None).
std::optional<py::tuple> attention_in_place(const AttentionCallInputs& call) {
  const AttentionOptions& options = call.options;
  const bool real = options.out_dtype == DType::kF32 || options.out_dtype == DType::kF64;
  if (!real || options.return_weights || options.max_memory != 0 || call.q.rank() < 2 ||
      call.v.rank() < 2) {
    return std::nullopt;
  }
  Shape shape = call.q.shape;
  shape.back() = call.v.shape.back();
  std::vector<std::size_t> order(shape.size());
  for (std::size_t a = 0; a < order.size(); ++a) order[a] = a;
  const std::size_t rank = shape.size();
  if (rank >= 3 && call.q.shape[rank - 3] > 1 && call.q.shape[rank - 2] > 1 &&
      call.q.strides[rank - 3] < call.q.strides[rank - 2]) {
    std::swap(order[rank - 3], order[rank - 2]);
  }
  py::array out = empty_in_order(options.out_dtype, shape, order);
  AttentionOutputs outputs{writable_view(out, options.out_dtype, "out"), std::nullopt,
                           std::nullopt};
  py::object lse_object = py::none();
  if (options.return_lse) {
    const Shape rows(call.q.shape.begin(), call.q.shape.end() - 1);
    std::vector<std::size_t> row_order(rows.size());
    for (std::size_t a = 0; a < row_order.size(); ++a) row_order[a] = a;
    py::array lse = empty_in_order(options.out_dtype, rows, row_order);
    outputs.lse = writable_view(lse, options.out_dtype, "lse");
    lse_object = lse;
  }
  std::string kernel;
  {
    py::gil_scoped_release computing;
    kernel = qkv::attention_into(call.q, call.k, call.v, options, outputs);
  }
  // The compute dtype (the last item of the full path's tuple) is not known here: None.
  return py::make_tuple(out, lse_object, py::none(), kernel, py::none());
}

py::tuple attention(const py::handle& q_in, const py::handle& k_in, const py::handle& v_in,
                    const py::dict& option_items) {
  ArrayKeeper keeper;
  const AttentionCallInputs call = attention_call_inputs(q_in, k_in, v_in, option_items, keeper);
  if (std::optional<py::tuple> done = attention_in_place(call)) return *done;
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
  m.def("use_openmp_threads", &qkv::use_openmp_threads, py::arg("library"),
        "See qkv.use_openmp_threads.");
  m.def("openmp_threads_library", &qkv::openmp_threads_library,
        "See qkv.openmp_threads_library.");
  m.def("attention_backward", &attention_backward, "See qkv.attention_backward.");
  m.def("backward_kernel_names", &qkv::attention_backward_kernel_names,
        "The backward kernel list, fastest first, the reference last.");
  m.def("alibi_slopes", &qkv::alibi_slopes, py::arg("heads"),
        "The standard ALiBi slopes for `heads` query heads.");
  m.def("kernel_names", &qkv::attention_kernel_names,
        "The kernel list, fastest first, the reference last.");
}

}  // namespace qkv::python
