// qkv._qkv.attention: the one call behind qkv.attention (python/qkv/_attention.py), which
// turns torch tensors, DLPack and __array__ objects into NumPy arrays and names the arguments.
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "arrays.h"
#include "bindings.h"
#include "qkv/attention.h"

namespace qkv::python {

namespace {

int thread_count(const std::optional<std::int64_t>& threads) {
  if (!threads) return 0;
  if (*threads < 0 || *threads > std::numeric_limits<int>::max()) {
    throw Error("threads", "must be 0 (one per hardware thread) or more, got " +
                               std::to_string(*threads));
  }
  return static_cast<int>(*threads);
}

// Outputs follow the inputs, as torch's do: float64 or float16 when Q, K and V all are, float32
// otherwise (mixed dtypes, bfloat16 bits, which NumPy cannot hold).
DType default_out_dtype(const TensorView& q, const TensorView& k, const TensorView& v) {
  if (q.dtype == k.dtype && k.dtype == v.dtype &&
      (q.dtype == DType::kF64 || q.dtype == DType::kF16)) {
    return q.dtype;
  }
  return DType::kF32;
}

py::tuple attention(const py::handle& q_in, const py::handle& k_in, const py::handle& v_in,
                    const py::handle& mask, bool causal, std::optional<double> scale,
                    std::optional<std::int64_t> window_left,
                    std::optional<std::int64_t> window_right, std::optional<double> softcap,
                    bool alibi, const py::handle& alibi_slopes, const py::handle& sinks,
                    const py::handle& cu_seqlens_q, const py::handle& cu_seqlens_k,
                    std::optional<std::string> dtype, std::optional<std::string> out_dtype,
                    bool return_lse, bool return_weights, std::optional<std::int64_t> threads,
                    std::optional<std::string> kernel, std::optional<std::uint64_t> max_memory) {
  ArrayKeeper keeper;
  const TensorView q = view_of(q_in, "q", keeper);
  const TensorView k = view_of(k_in, "k", keeper);
  const TensorView v = view_of(v_in, "v", keeper);
  AttentionOptions options;
  options.mask = optional_view_of(mask, "attn_mask", keeper);
  options.causal = causal;
  options.scale = scale;
  if (window_left || window_right) options.window = Window{window_left.value_or(-1), window_right.value_or(-1)};
  options.softcap = softcap;
  options.alibi = alibi;
  options.alibi_slopes = optional_view_of(alibi_slopes, "alibi_slopes", keeper);
  options.sinks = optional_view_of(sinks, "sinks", keeper);
  options.cu_seqlens_q = optional_view_of(cu_seqlens_q, "cu_seqlens_q", keeper);
  options.cu_seqlens_k = optional_view_of(cu_seqlens_k, "cu_seqlens_k", keeper);
  if (dtype) options.dtype = parse_dtype(*dtype, "dtype");
  options.out_dtype = out_dtype ? parse_dtype(*out_dtype, "out_dtype") : default_out_dtype(q, k, v);
  options.return_lse = return_lse;
  options.return_weights = return_weights;
  options.threads = thread_count(threads);
  if (kernel) options.kernel = *kernel;
  if (max_memory) options.max_memory = *max_memory;

  AttentionResult result;
  try {
    py::gil_scoped_release computing;
    result = qkv::attention(q, k, v, options);
  } catch (const Error& e) {
    // The library names the mask "mask" where it names no view (a mask with a packed batch);
    // Python callers know the argument as attn_mask.
    if (e.subject() == "mask") throw Error("attn_mask", e.problem());
    throw;
  }
  py::object lse = return_lse ? py::object(to_numpy(std::move(result.lse))) : py::none();
  py::object weights =
      return_weights ? py::object(to_numpy(std::move(result.weights))) : py::none();
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
