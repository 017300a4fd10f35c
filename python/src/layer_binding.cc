// qkv._qkv.linear, qkv._qkv.multi_head_attention and its backward: the calls behind qkv.linear,
// qkv.MultiHeadAttention and its backward (python/qkv/_layer.py), which keeps the weights and
// names the arguments. LayerForwardState is the forward's state the backward reads, opaque to
// Python (qkv.LayerState holds it beside the forward's inputs).
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <utility>

#include "arrays.h"
#include "bindings.h"
#include "options.h"
#include "qkv/layer.h"
#include "qkv/layer_backward.h"

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

// One layer call's inputs as qkv.MultiHeadAttention passes them, the output dtype following the
// inputs unless the dict names one.
struct LayerCall {
  TensorView x;
  std::optional<TensorView> memory;
  LayerWeights weights;
  LayerOptions options;
};

LayerCall layer_call(const py::handle& x_in, const py::handle& memory_in,
                     const py::tuple& weight_arrays, std::int64_t heads, std::int64_t kv_heads,
                     const py::dict& option_items, ArrayKeeper& keeper) {
  LayerCall call{view_of(x_in, "x", keeper), optional_view_of(memory_in, "memory", keeper),
                 layer_weights(weight_arrays, keeper),
                 layer_options(heads, kv_heads, option_items, keeper)};
  if (!has_item(option_items, "out_dtype")) {
    const auto view = [](const std::optional<TensorView>& v) { return v ? &*v : nullptr; };
    const LayerWeights& w = call.weights;
    call.options.attention.out_dtype =
        default_out_dtype({&call.x, view(call.memory), &w.wq, &w.wk, &w.wv, view(w.wo),
                           view(w.bq), view(w.bk), view(w.bv), view(w.bo)});
  }
  return call;
}

// (out, lse or None, weights or None, kernel, state or None): the state (for the backward) when
// `keep_state`.
py::tuple multi_head_attention(const py::handle& x_in, const py::handle& memory_in,
                               const py::tuple& weight_arrays, std::int64_t heads,
                               std::int64_t kv_heads, const py::dict& option_items,
                               bool keep_state) {
  ArrayKeeper keeper;
  const LayerCall call =
      layer_call(x_in, memory_in, weight_arrays, heads, kv_heads, option_items, keeper);
  const LayerOptions& options = call.options;
  LayerResult result;
  LayerForwardState state;
  {
    py::gil_scoped_release computing;
    result = keep_state
                 ? qkv::multi_head_attention(call.x, call.weights, options, call.memory, state)
                 : qkv::multi_head_attention(call.x, call.weights, options, call.memory);
  }
  py::object lse = options.attention.return_lse ? py::object(to_numpy(std::move(result.lse)))
                                                : py::none();
  py::object attention_weights = options.attention.return_weights
                                     ? py::object(to_numpy(std::move(result.weights)))
                                     : py::none();
  py::object kept = keep_state ? py::cast(std::move(state)) : py::none();
  return py::make_tuple(to_numpy(std::move(result.out)), lse, attention_weights, result.kernel,
                        kept);
}

// The gradients of Σ out∘grad_out: (dx, dmemory, dwq, dwk, dwv, dwo, dbq, dbk, dbv, dbo,
// dsinks, kernel), None for each the layer does not have. `state` (None: the forward runs
// again) is the forward's on the same inputs and options.
py::tuple multi_head_attention_backward(const py::handle& x_in, const py::handle& memory_in,
                                        const py::tuple& weight_arrays, std::int64_t heads,
                                        std::int64_t kv_heads, const py::dict& option_items,
                                        const py::handle& grad_out_in,
                                        const py::handle& state_in) {
  ArrayKeeper keeper;
  const LayerCall call =
      layer_call(x_in, memory_in, weight_arrays, heads, kv_heads, option_items, keeper);
  const TensorView grad_out = view_of(grad_out_in, "grad_out", keeper);
  const LayerForwardState* state =
      state_in.is_none() ? nullptr : &state_in.cast<const LayerForwardState&>();
  LayerGradients g;
  {
    py::gil_scoped_release computing;
    g = qkv::multi_head_attention_backward(call.x, call.weights, call.options, grad_out,
                                           call.memory, state);
  }
  // What the layer has comes back, of no elements when its input has none; the rest is None.
  py::object dsinks = call.options.attention.sinks ? py::object(to_numpy(std::move(g.dsinks)))
                                                   : py::object(py::none());
  py::object dx = to_numpy(std::move(g.dx));
  py::object dmemory = call.memory ? py::object(to_numpy(std::move(g.dmemory))) : py::none();
  py::object dwo = call.weights.wo ? py::object(to_numpy(std::move(g.dwo))) : py::none();
  const auto bias = [&](const std::optional<TensorView>& given, Tensor& t) {
    return given ? py::object(to_numpy(std::move(t))) : py::object(py::none());
  };
  return py::make_tuple(dx, dmemory, to_numpy(std::move(g.dwq)), to_numpy(std::move(g.dwk)),
                        to_numpy(std::move(g.dwv)), dwo, bias(call.weights.bq, g.dbq),
                        bias(call.weights.bk, g.dbk), bias(call.weights.bv, g.dbv),
                        bias(call.weights.bo, g.dbo), dsinks, g.kernel);
}

}  // namespace

void register_layer(py::module_& m) {
  m.def("linear", &linear, "See qkv.linear.");
  py::class_<LayerForwardState>(m, "LayerForwardState",
                                "The layer forward's projections, heads and lse, for its "
                                "backward (qkv.LayerState holds it).");
  m.def("multi_head_attention", &multi_head_attention, "See qkv.MultiHeadAttention.");
  m.def("multi_head_attention_backward", &multi_head_attention_backward,
        "See qkv.MultiHeadAttention.backward.");
}

}  // namespace qkv::python
