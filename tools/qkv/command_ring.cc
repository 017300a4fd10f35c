// qkv attention --ring: each rank reads its own rows of the inputs and of the mask
// (read_tensor_rows: by offsets into the file) and runs its part of the ring, then, with
// --grad-out, its part of the backward ring; rank 0 gathers O, the lse and the gradients and
// writes them through the usual all-or-nothing output path. Every rank agrees on success before
// the ring and after writing.
#include "command_ring.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/format_bytes.h"
#include "qkv/dist.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv::cli {
namespace {

constexpr int kExitStatusUsage = 2;

bool ring_backward_kernel(const std::string& name) {
  return name.empty() || name == "fused_hwy" || name == "unfused_blas" || name == "fused_scalar";
}

// The ring on this rank, once MPI runs: read, compute, gather, write.
void run_ring_ranks(const RingCommand& command, const AttentionFlags& flags,
                    const dist::Communicator& comm, int ranks, int me);

std::vector<RowSpan> row_spans(const std::vector<dist::RowRange>& ranges) {
  std::vector<RowSpan> spans;
  for (const dist::RowRange& r : ranges) spans.push_back({r.first, r.last});
  return spans;
}

}  // namespace

void print_ring_times(const char* what, const dist::RingTimes& t, const std::string& kernel,
                      int threads, int rank, int ranks, std::int64_t rows, double seconds) {
  std::fprintf(stderr,
               "%s: rank %d/%d: %lld rows, kernel %s, %d threads: compute %.6f s, wait %.6f s, "
               "transfer %.6f s (%lld bytes sent), blocks computed %lld, skipped %lld, total "
               "%.6f s\n",
               what, rank, ranks, static_cast<long long>(rows), kernel.c_str(), threads, t.compute,
               t.wait, t.transfer, static_cast<long long>(t.bytes_sent),
               static_cast<long long>(t.blocks_computed), static_cast<long long>(t.blocks_skipped),
               seconds);
}

Tensor read_rows(const std::string& spec, int ranks, int rank, dist::RowLayout layout,
                 std::int64_t& rows) {
  const TensorInfo info = inspect_input(spec);
  const std::size_t r = info.shape.size();
  if (r < 2) throw Error(spec, "expected 2, 3 or 4 dims, got " + shape_string(info.shape));
  rows = info.shape[r - 2];
  return read_input_rows(spec, row_spans(dist::rank_rows(rows, ranks, rank, layout)));
}

std::uint64_t rows_share(const TensorInfo& info, std::int64_t rows) {
  const std::int64_t total = info.shape[info.shape.size() - 2];
  return total == 0
             ? 0
             : info.bytes / static_cast<std::uint64_t>(total) * static_cast<std::uint64_t>(rows);
}

std::int64_t widest_rank_rows(std::int64_t n, int ranks, dist::RowLayout layout) {
  std::int64_t widest = 0;
  for (int r = 0; r < ranks; ++r)
    widest = std::max(widest, dist::rank_row_count(n, ranks, r, layout));
  return widest;
}

void refuse_over_budget(std::uint64_t bytes, std::uint64_t budget, const std::string& counted) {
  if (bytes < budget) return;
  throw Error("--max-memory", "this rank's part of the ring takes about " +
                                  core::format_bytes_exact(bytes) + " (" + counted +
                                  "); the memory budget is " + core::format_bytes_exact(budget));
}

namespace {

// The --mask: this rank's query rows of it (read alone, as read_rows reads them) unless that
// axis broadcasts (one row for every query), every key; 16-bit masks widened as load_mask does.
std::optional<Tensor> load_mask_rows(const AttentionFlags& flags, std::int64_t nq, int ranks,
                                     int rank, dist::RowLayout layout) {
  if (flags.mask_path.empty()) return std::nullopt;
  const TensorInfo info = inspect_input(flags.mask_path);
  const std::size_t r = info.shape.size();
  if (r < 2 || info.shape[r - 2] != nq || nq == 1) return load_mask(flags);
  return widen_mask(
      read_input_rows(flags.mask_path, row_spans(dist::rank_rows(nq, ranks, rank, layout))),
      flags.mask_path);
}

// Refuses, from the files' headers and before any input is read, a rank whose part of the run
// would pass the --max-memory budget (each rank holds it alone: P ranks on one machine may
// together take P budgets). Counted: its rows of Q, K and V (and of the mask), the two K/V
// blocks in flight (the largest rank's rows), its rows of O and the lse as computed, and on rank
// 0 the gathered O and lse it writes; with gradients the backward's rows, accumulators and row
// statistics; the kernel's tiles (well under a MiB per thread) come on top. A file that cannot be inspected is left to read_rows, which says why.
void check_rank_budget(const RingCommand& command, const AttentionFlags& flags, int ranks, int me,
                       dist::RowLayout layout) {
  const std::uint64_t budget = memory_budget(flags);
  if (budget == 0) return;
  TensorInfo q, k, v;
  try {
    q = inspect_input(command.q_path);
    k = inspect_input(command.k_path);
    v = inspect_input(command.v_path);
  } catch (const Error&) {
    return;
  }
  if (q.shape.size() < 2 || k.shape.size() < 2 || v.shape.size() < 2) return;
  const std::int64_t nq = q.shape[q.shape.size() - 2];
  const std::int64_t nk = k.shape[k.shape.size() - 2];
  const std::int64_t my_q = dist::rank_row_count(nq, ranks, me, layout);
  const std::int64_t my_k = dist::rank_row_count(nk, ranks, me, layout);
  const std::int64_t widest_k = widest_rank_rows(nk, ranks, layout);
  std::uint64_t bytes = rows_share(q, my_q) + rows_share(k, my_k) + rows_share(v, my_k) +
                        2 * (rows_share(k, widest_k) + rows_share(v, widest_k));
  // Rows of O: one per (batch, head, query row), dv values each, float64 for a float64 call,
  // and a float64 lse.
  const std::int64_t d = q.shape.back(), dv = v.shape.back();
  const std::uint64_t q_rows =
      d == 0 || nq == 0 ? 0 : q.bytes / dtype_size(q.dtype) / static_cast<std::uint64_t>(d);
  const std::uint64_t out_elem = q.dtype == DType::kF64 ? 8 : 4;
  const std::uint64_t row_bytes = static_cast<std::uint64_t>(dv) * out_elem + 8;
  if (nq > 0)
    bytes += q_rows / static_cast<std::uint64_t>(nq) * static_cast<std::uint64_t>(my_q) * row_bytes;
  if (me == 0) bytes += q_rows * row_bytes;
  if (!command.gradients.grad_out.empty()) {
    // Its rows of DO, of dQ, dK and dV as computed, the two dK/dV accumulators in flight, and
    // on rank 0 the gathered gradients.
    const auto as_computed = [&](const TensorInfo& t, std::int64_t rows) {
      return rows_share(t, rows) / dtype_size(t.dtype) * out_elem;
    };
    try {
      bytes += rows_share(inspect_input(command.gradients.grad_out), my_q);
    } catch (const Error&) {
    }
    bytes += as_computed(q, my_q) + as_computed(k, my_k) + as_computed(v, my_k) +
             2 * (as_computed(k, widest_k) + as_computed(v, widest_k));
    // The softmax statistics the backward merges over the ring: seven float64 per query row
    // (its merged max, sum, Σ P·dP and D, and one kernel call's max, sum and Σ P·dP).
    if (nq > 0) {
      bytes += q_rows / static_cast<std::uint64_t>(nq) * static_cast<std::uint64_t>(my_q) * 56;
    }
    if (me == 0) bytes += as_computed(q, nq) + as_computed(k, nk) + as_computed(v, nk);
  }
  if (!flags.mask_path.empty()) {
    try {
      const TensorInfo mask = inspect_input(flags.mask_path);
      const std::size_t r = mask.shape.size();
      const std::uint64_t held =
          r >= 2 && mask.shape[r - 2] == nq && nq != 1 ? rows_share(mask, my_q) : mask.bytes;
      const bool widened = mask.dtype == DType::kF16 || mask.dtype == DType::kBF16;
      bytes += widened ? 2 * held : held;
    } catch (const Error&) {
    }
  }
  refuse_over_budget(bytes, budget,
                     "its rows of the inputs, two K/V blocks in flight, its output rows" +
                         std::string(me == 0 ? " and the gathered output" : ""));
}

}  // namespace

void run_on_ranks(const char* command, const std::string& refused,
                  const std::function<void(const dist::Communicator&, int, int)>& body) {
  if (!refused.empty()) {
    if (dist::mpi_available()) {
      // Every rank refuses alike. Under mpirun rank 0 says so before any rank exits: mpirun
      // ends the job as soon as one rank exits non-zero, which could kill rank 0 before it had
      // printed (a test saw an empty stderr once in eight runs on a busy machine).
      dist::MpiSession session(nullptr, nullptr);
      const dist::Communicator comm = dist::Communicator::world();
      if (comm.size() > 1) {
        if (comm.rank() == 0) {
          std::fprintf(stderr, "%s: --ring: cannot be combined with %s (see '%s --help')\n",
                       command, refused.c_str(), command);
          std::fflush(stderr);
        }
        dist::barrier(comm);
        throw AlreadyReported{kExitStatusUsage};
      }
    }
    throw CLI::ValidationError("--ring", "cannot be combined with " + refused);
  }
  if (!dist::mpi_available()) {
    throw CLI::ValidationError("--ring", "this build of qkv has no MPI");
  }
  dist::MpiSession session(nullptr, nullptr);
  const dist::Communicator comm = dist::Communicator::world();
  const int ranks = comm.size();
  const int me = comm.rank();
  try {
    body(comm, ranks, me);
  } catch (const dist::AgreedError& e) {
    // Every rank has this error. Rank 0 says it before any rank exits: mpirun ends the whole
    // job as soon as one rank exits non-zero, which could kill rank 0 before it had printed
    // (a fault test saw an empty stderr once in CI).
    if (me == 0) {
      std::fprintf(stderr, "%s\n", e.what());
      std::fflush(stderr);
    }
    dist::barrier(comm);
    throw AlreadyReported{kExitStatusBadInput};
  }
}

void run_ring_attention(const RingCommand& command, const std::string& refused) {
  run_on_ranks("qkv attention", refused, [&](const dist::Communicator& comm, int ranks, int me) {
    run_ring_ranks(command, *command.flags, comm, ranks, me);
  });
}

namespace {

void run_ring_ranks(const RingCommand& command, const AttentionFlags& flags,
                    const dist::Communicator& comm, int ranks, int me) {
  const RingGradientPaths& wanted = command.gradients;
  const bool gradients = !wanted.grad_out.empty();
  std::string problem;
  Tensor q, k, v, grad_out;
  AttentionTensors tensors;
  AttentionOptions options;
  dist::RowLayout layout = dist::RowLayout::kContiguous;
  std::vector<dist::Setting> settings;
  try {
    settings = attention_ring_settings(command);
    if (!ring_backward_kernel(wanted.backward_kernel)) {
      throw Error("--backward-kernel",
                  "the ring's backward runs fused_hwy, unfused_blas or "
                  "fused_scalar (the tiled kernels, which take the whole row's softmax "
                  "statistics), not " +
                      wanted.backward_kernel);
    }
    AttentionFlags without_mask = flags;  // the mask is read below, this rank's rows alone
    without_mask.mask_path.clear();
    tensors = load_attention_tensors(without_mask);
    options = attention_options(flags, tensors);
    layout = dist::default_layout(options);
    check_rank_budget(command, flags, ranks, me, layout);
    std::int64_t nq = 0, nk = 0, n_grad = 0;
    q = read_rows(command.q_path, ranks, me, layout, nq);
    k = read_rows(command.k_path, ranks, me, layout, nk);
    v = read_rows(command.v_path, ranks, me, layout, nk);
    if (gradients) {
      grad_out = read_rows(wanted.grad_out, ranks, me, layout, n_grad);
      if (n_grad != nq) {
        throw Error(wanted.grad_out, "holds " + std::to_string(n_grad) + " rows; the output has " +
                                         std::to_string(nq) + " (" + command.q_path + "'s)");
      }
    }
    tensors.mask = load_mask_rows(flags, nq, ranks, me, layout);
    options = attention_options(flags, tensors);
    options.return_lse = !flags.lse_path.empty() || gradients;  // the backward reads it
    options.max_memory = 0;  // the rank's budget was checked above (check_rank_budget)
  } catch (const std::exception& e) {
    problem = e.what();
  }
  dist::agree(comm, problem);
  // Before any collective that depends on the flags (the backward, the gathers).
  dist::agree_on_settings(comm, settings);

  const auto start = std::chrono::steady_clock::now();
  const dist::RingResult result = within_memory_budget("attention --ring", [&] {
    return dist::ring_attention(q.view(), k.view(), v.view(), options, comm, {layout});
  });
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  dist::RingGradients grads;
  std::chrono::duration<double> backward_seconds{0};
  if (gradients) {
    AttentionOptions backward = options;
    backward.kernel = wanted.backward_kernel;
    const auto begin = std::chrono::steady_clock::now();
    grads = within_memory_budget("attention --ring backward", [&] {
      return dist::ring_attention_backward(q.view(), k.view(), v.view(), result.out.view(),
                                           result.lse.view(), grad_out.view(), backward, comm,
                                           {layout});
    });
    backward_seconds = std::chrono::steady_clock::now() - begin;
  }
  const Tensor out = dist::gather_rows(result.out.view(), -2, result.n, layout, comm);
  const Tensor lse = flags.lse_path.empty()
                         ? Tensor()
                         : dist::gather_rows(result.lse.view(), -1, result.n, layout, comm);
  const auto gathered = [&](const std::string& path, const Tensor& local, std::int64_t n) {
    return path.empty() ? Tensor() : dist::gather_rows(local.view(), -2, n, layout, comm);
  };
  const Tensor dq = gathered(wanted.grad_q, grads.dq, grads.n);
  const Tensor dk = gathered(wanted.grad_k, grads.dk, grads.n_k);
  const Tensor dv = gathered(wanted.grad_v, grads.dv, grads.n_k);
  if (me == 0) {
    try {
      std::vector<OutputFile> outputs = {{command.out_path, out.view(), "--out"}};
      add_extra_outputs(flags, Tensor(), lse, outputs);
      if (!wanted.grad_q.empty()) outputs.push_back({wanted.grad_q, dq.view(), "--grad-q"});
      if (!wanted.grad_k.empty()) outputs.push_back({wanted.grad_k, dk.view(), "--grad-k"});
      if (!wanted.grad_v.empty()) outputs.push_back({wanted.grad_v, dv.view(), "--grad-v"});
      if (!wanted.grad_sinks.empty()) {
        outputs.push_back({wanted.grad_sinks, grads.dsinks.view(), "--grad-sinks"});
      }
      write_outputs(outputs, options.out_dtype);
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  dist::agree(comm, problem);
  if (command.verbose) {
    const std::int64_t rows = q.shape().empty() ? 0 : q.shape()[q.shape().size() - 2];
    print_ring_times("qkv attention --ring", result.times, result.kernel, result.threads, me, ranks,
                     rows, seconds.count());
    if (gradients) {
      print_ring_times("qkv attention --ring backward", grads.times, grads.kernel, grads.threads,
                       me, ranks, rows, backward_seconds.count());
    }
  }
}

}  // namespace

}  // namespace qkv::cli
