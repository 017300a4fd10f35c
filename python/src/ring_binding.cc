// qkv._qkv.ring_attention, ring_attention_backward and ring_rows: attention across the
// processes of an MPI communicator (qkv/dist.h), behind qkv.ring_attention and
// qkv.ring_attention_backward (python/qkv/_ring.py, over mpi4py).
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "options.h"
#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::python {

namespace {

dist::RowLayout layout_of(const std::string& name) {
  if (name == "contiguous") return dist::RowLayout::kContiguous;
  if (name == "zigzag") return dist::RowLayout::kZigZag;
  throw Error("layout", "expected 'contiguous' or 'zigzag', got '" + name + "'");
}

py::dict times_of(const dist::RingTimes& t) {
  py::dict times;
  times["compute"] = t.compute;
  times["wait"] = t.wait;
  times["transfer"] = t.transfer;
  times["bytes_sent"] = t.bytes_sent;
  times["blocks_computed"] = t.blocks_computed;
  times["blocks_skipped"] = t.blocks_skipped;
  return times;
}

// (out, lse or None, n, kernel, compute dtype, times dict) of this rank's rows.
py::tuple ring_attention(const py::handle& q_in, const py::handle& k_in, const py::handle& v_in,
                         const py::dict& option_items, int comm_handle, const std::string& layout) {
  ArrayKeeper keeper;
  const AttentionCallInputs call = attention_call_inputs(q_in, k_in, v_in, option_items, keeper);
  const dist::RowLayout rows = layout_of(layout);
  dist::RingResult result;
  {
    // The ring's collectives wait on the other ranks: never while holding the GIL.
    py::gil_scoped_release computing;
    const dist::Communicator comm = dist::Communicator::from_fortran(comm_handle);
    result = dist::ring_attention(call.q, call.k, call.v, call.options, comm, {rows});
  }
  const py::dict times = times_of(result.times);
  py::object lse = result.lse.empty() ? py::none() : py::object(to_numpy(std::move(result.lse)));
  return py::make_tuple(to_numpy(std::move(result.out)), lse, result.n, result.kernel,
                        dtype_name(result.compute), times);
}

// (dq, dk, dv, dsinks or None, kernel, compute dtype, times dict) of this rank's rows.
py::tuple ring_attention_backward(const py::handle& q_in, const py::handle& k_in,
                                  const py::handle& v_in, const py::handle& out_in,
                                  const py::handle& lse_in, const py::handle& grad_out_in,
                                  const py::dict& option_items, int comm_handle,
                                  const std::string& layout) {
  ArrayKeeper keeper;
  const AttentionCallInputs call = attention_call_inputs(q_in, k_in, v_in, option_items, keeper);
  const TensorView out = view_of(out_in, "out", keeper);
  const TensorView lse = view_of(lse_in, "lse", keeper);
  const TensorView grad_out = view_of(grad_out_in, "grad_out", keeper);
  const dist::RowLayout rows = layout_of(layout);
  dist::RingGradients g;
  {
    py::gil_scoped_release computing;
    const dist::Communicator comm = dist::Communicator::from_fortran(comm_handle);
    g = dist::ring_attention_backward(call.q, call.k, call.v, out, lse, grad_out, call.options,
                                      comm, {rows});
  }
  py::object dsinks = g.dsinks.empty() ? py::none() : py::object(to_numpy(std::move(g.dsinks)));
  return py::make_tuple(to_numpy(std::move(g.dq)), to_numpy(std::move(g.dk)),
                        to_numpy(std::move(g.dv)), dsinks, g.kernel, dtype_name(g.compute),
                        times_of(g.times));
}

std::vector<std::pair<std::int64_t, std::int64_t>> ring_rows(std::int64_t n, int ranks, int rank,
                                                             const std::string& layout) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (const dist::RowRange& r : dist::rank_rows(n, ranks, rank, layout_of(layout))) {
    out.emplace_back(r.first, r.last);
  }
  return out;
}

}  // namespace

void register_ring(py::module_& m) {
  m.def("ring_attention", &ring_attention, "See qkv.ring_attention.");
  m.def("ring_attention_backward", &ring_attention_backward, "See qkv.ring_attention_backward.");
  m.def("ring_rows", &ring_rows, "See qkv.ring_rows.");
  m.def("mpi_available", &dist::mpi_available, "Whether this build of qkv has MPI.");
}

}  // namespace qkv::python
