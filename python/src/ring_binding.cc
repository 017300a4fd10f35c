// qkv._qkv.ring_attention and ring_rows: attention across the processes of an MPI
// communicator (qkv/dist.h), behind qkv.ring_attention (python/qkv/_ring.py, over mpi4py).
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
  py::dict times;
  times["compute"] = result.times.compute;
  times["wait"] = result.times.wait;
  times["transfer"] = result.times.transfer;
  times["bytes_sent"] = result.times.bytes_sent;
  times["blocks_computed"] = result.times.blocks_computed;
  times["blocks_skipped"] = result.times.blocks_skipped;
  py::object lse = result.lse.empty() ? py::none() : py::object(to_numpy(std::move(result.lse)));
  return py::make_tuple(to_numpy(std::move(result.out)), lse, result.n, result.kernel,
                        dtype_name(result.compute), times);
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
  m.def("ring_rows", &ring_rows, "See qkv.ring_rows.");
  m.def("mpi_available", &dist::mpi_available, "Whether this build of qkv has MPI.");
}

}  // namespace qkv::python
