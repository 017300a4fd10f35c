// qkv._qkv.linear and qkv._qkv.multi_head_attention: the calls behind qkv.linear and
// qkv.MultiHeadAttention (python/qkv/_layer.py), which keeps the weights and names the arguments.
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <utility>

#include "arrays.h"
#include "bindings.h"
#include "options.h"
#include "qkv/layer.h"

namespace qkv::python {

namespace {

py::array linear(const py::handle& x_in, const py::handle& w_in, const py::handle& bias_in,
                 const py::handle& threads) {
  ArrayKeeper keeper;
  const TensorView x = view_of(x_in, "x", keeper);
  const TensorView w = view_of(w_in, "w", keeper);
  const std::optional<TensorView> bias = optional_view_of(bias_in, "bias", keeper);
  const int thread_count = thread_option(threads);
  Tensor out;
  {
    py::gil_scoped_release computing;
    out = qkv::linear(x, w, bias, thread_count);
  }
  return to_numpy(std::move(out));
}

py::tuple multi_head_attention(const py::handle& x_in, const py::handle& memory_in,
                               const py::tuple& weight_arrays, std::int64_t heads,
                               std::int64_t kv_heads, const py::dict& option_items) {
  ArrayKeeper keeper;
  const TensorView x = view_of(x_in, "x", keeper);
  const std::optional<TensorView> memory = optional_view_of(memory_in, "memory", keeper);
  const LayerWeights weights = layer_weights(weight_arrays, keeper);
  LayerOptions options = layer_options(heads, kv_heads, option_items, keeper);
  if (!has_item(option_items, "out_dtype")) {
    const auto view = [](const std::optional<TensorView>& v) { return v ? &*v : nullptr; };
    options.attention.out_dtype = default_out_dtype(
        {&x, view(memory), &weights.wq, &weights.wk, &weights.wv, view(weights.wo),
         view(weights.bq), view(weights.bk), view(weights.bv), view(weights.bo)});
  }
  LayerResult result;
  {
    py::gil_scoped_release computing;
    result = qkv::multi_head_attention(x, weights, options, memory);
  }
  py::object lse = options.attention.return_lse ? py::object(to_numpy(std::move(result.lse)))
                                                : py::none();
  py::object attention_weights = options.attention.return_weights
                                     ? py::object(to_numpy(std::move(result.weights)))
                                     : py::none();
  return py::make_tuple(to_numpy(std::move(result.out)), lse, attention_weights, result.kernel);
}

}  // namespace

void register_layer(py::module_& m) {
  m.def("linear", &linear, "See qkv.linear.");
  m.def("multi_head_attention", &multi_head_attention, "See qkv.MultiHeadAttention.");
}

}  // namespace qkv::python
