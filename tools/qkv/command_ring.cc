// qkv attention --ring: each rank reads the inputs, keeps its own rows (dist::slice_rows), and
// runs its part of the ring; rank 0 gathers O and the lse and writes them through the usual
// all-or-nothing output path. Every rank agrees on success before the ring and after writing.
#include "command_ring.h"

#include <chrono>
#include <cstdio>
#include <string>

#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::cli {
namespace {

void print_times(const dist::RingResult& r, int rank, int ranks, std::int64_t rows,
                 double seconds) {
  const dist::RingTimes& t = r.times;
  std::fprintf(stderr,
               "qkv attention --ring: rank %d/%d: %lld rows, kernel %s, %d threads: compute "
               "%.6f s, wait %.6f s, transfer %.6f s (%lld bytes sent), blocks computed %lld, "
               "skipped %lld, total %.6f s\n",
               rank, ranks, static_cast<long long>(rows), r.kernel.c_str(), r.threads, t.compute,
               t.wait, t.transfer, static_cast<long long>(t.bytes_sent),
               static_cast<long long>(t.blocks_computed), static_cast<long long>(t.blocks_skipped),
               seconds);
}

}  // namespace

void run_ring_attention(const RingCommand& command, const std::string& refused) {
  if (!refused.empty()) {
    throw CLI::ValidationError("--ring", "cannot be combined with " + refused);
  }
  if (!dist::mpi_available()) {
    throw CLI::ValidationError("--ring", "this build of qkv has no MPI");
  }
  const AttentionFlags& flags = *command.flags;
  dist::MpiSession session(nullptr, nullptr);
  const dist::Communicator comm = dist::Communicator::world();
  const int ranks = comm.size();
  const int me = comm.rank();

  std::string problem;
  Tensor q, k, v;
  AttentionTensors tensors;
  AttentionOptions options;
  dist::RowLayout layout = dist::RowLayout::kContiguous;
  try {
    tensors = load_attention_tensors(flags);
    options = attention_options(flags, tensors);
    layout = dist::default_layout(options);
    // Each rank reads the whole input and keeps its rows: simple, not yet frugal.
    std::int64_t nq = 0;
    const auto rows_of = [&](const std::string& path) {
      const Tensor whole = read_input(path);
      if (whole.shape().size() < 2) {
        throw Error(path, "expected 2, 3 or 4 dims, got " + shape_string(whole.shape()));
      }
      if (nq == 0) nq = whole.shape()[whole.shape().size() - 2];
      return dist::slice_rows(whole.view(), -2, ranks, me, layout);
    };
    q = rows_of(command.q_path);
    k = rows_of(command.k_path);
    v = rows_of(command.v_path);
    // The mask: this rank's query rows (unless that axis broadcasts), every key.
    if (tensors.mask && tensors.mask->shape().size() >= 2) {
      const Shape& shape = tensors.mask->shape();
      if (shape[shape.size() - 2] == nq && nq != 1) {
        tensors.mask = dist::slice_rows(tensors.mask->view(), -2, ranks, me, layout);
      }
    }
    options = attention_options(flags, tensors);
    options.return_lse = !flags.lse_path.empty();
    options.max_memory = 0;  // the ring's memory is per rank; no budget yet
  } catch (const std::exception& e) {
    problem = e.what();
  }
  dist::agree(comm, problem);

  const auto start = std::chrono::steady_clock::now();
  const dist::RingResult result = within_memory_budget("attention --ring", [&] {
    return dist::ring_attention(q.view(), k.view(), v.view(), options, comm, {layout});
  });
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  const Tensor out = dist::gather_rows(result.out.view(), -2, result.n, layout, comm);
  const Tensor lse = result.lse.empty()
                         ? Tensor()
                         : dist::gather_rows(result.lse.view(), -1, result.n, layout, comm);
  if (me == 0) {
    try {
      std::vector<OutputFile> outputs = {{command.out_path, out.view()}};
      add_extra_outputs(flags, Tensor(), lse, outputs);
      write_outputs(outputs, options.out_dtype);
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  dist::agree(comm, problem);
  if (command.verbose)
    print_times(result, me, ranks, q.shape().empty() ? 0 : q.shape()[q.shape().size() - 2],
                seconds.count());
}

}  // namespace qkv::cli
