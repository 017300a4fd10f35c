// qkv attention --ring: each rank reads its own rows of the inputs (of an .npy file, by offsets
// into it; any other tensor file whole, then sliced) and runs its part of the ring, then, with
// --grad-out, its part of the backward ring; rank 0 gathers O, the lse and the gradients and
// writes them through the usual all-or-nothing output path. Every rank agrees on success before
// the ring and after writing.
#include "command_ring.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

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

// Where an .npy file's data starts: after the preamble (magic, version, header length) and the
// header, which inspect_npy has validated.
std::uint64_t npy_data_offset(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::array<unsigned char, 12> pre{};
  file.read(reinterpret_cast<char*>(pre.data()), pre.size());
  if (!file) throw Error(path, "cannot read its .npy preamble");
  if (pre[6] == 1) return 10 + (std::uint64_t{pre[8]} | std::uint64_t{pre[9]} << 8);
  return 12 + (std::uint64_t{pre[8]} | std::uint64_t{pre[9]} << 8 | std::uint64_t{pre[10]} << 16 |
               std::uint64_t{pre[11]} << 24);
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
  const bool npy = spec.size() > 4 && spec.compare(spec.size() - 4, 4, ".npy") == 0;
  if (!npy) {
    const Tensor whole = read_input(spec);
    if (whole.shape().size() < 2) {
      throw Error(spec, "expected 2, 3 or 4 dims, got " + shape_string(whole.shape()));
    }
    rows = whole.shape()[whole.shape().size() - 2];
    return dist::slice_rows(whole.view(), -2, ranks, rank, layout);
  }
  const TensorInfo info = inspect_npy(spec);
  const std::size_t r = info.shape.size();
  if (r < 2) throw Error(spec, "expected 2, 3 or 4 dims, got " + shape_string(info.shape));
  rows = info.shape[r - 2];
  const std::vector<dist::RowRange> mine = dist::rank_rows(rows, ranks, rank, layout);
  Shape shape = info.shape;
  shape[r - 2] = dist::rank_row_count(rows, ranks, rank, layout);
  Tensor part(info.dtype, shape, spec);
  std::int64_t outer = 1;
  for (std::size_t i = 0; i + 2 < r; ++i) outer *= info.shape[i];
  const auto row_bytes = static_cast<std::int64_t>(dtype_size(info.dtype)) * info.shape[r - 1];
  const std::uint64_t start = npy_data_offset(spec);
  std::ifstream file(spec, std::ios::binary);
  auto* to = static_cast<char*>(part.data());
  for (std::int64_t o = 0; o < outer; ++o) {
    for (const dist::RowRange& range : mine) {
      const std::int64_t bytes = range.size() * row_bytes;
      file.seekg(static_cast<std::streamoff>(start) + (o * rows + range.first) * row_bytes);
      file.read(to, bytes);
      if (!file)
        throw Error(spec, "cannot read rows " + std::to_string(range.first) + ".." +
                              std::to_string(range.last - 1));
      to += bytes;
    }
  }
  return part;
}

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
  try {
    if (!ring_backward_kernel(wanted.backward_kernel)) {
      throw Error("--backward-kernel",
                  "the ring's backward runs fused_hwy, unfused_blas or "
                  "fused_scalar (the kernels that read the saved lse), not " +
                      wanted.backward_kernel);
    }
    tensors = load_attention_tensors(flags);
    options = attention_options(flags, tensors);
    layout = dist::default_layout(options);
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
    // The mask: this rank's query rows (unless that axis broadcasts), every key.
    if (tensors.mask && tensors.mask->shape().size() >= 2) {
      const Shape& shape = tensors.mask->shape();
      if (shape[shape.size() - 2] == nq && nq != 1) {
        tensors.mask = dist::slice_rows(tensors.mask->view(), -2, ranks, me, layout);
      }
    }
    options = attention_options(flags, tensors);
    options.return_lse = !flags.lse_path.empty() || gradients;  // the backward reads it
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
      std::vector<OutputFile> outputs = {{command.out_path, out.view()}};
      add_extra_outputs(flags, Tensor(), lse, outputs);
      if (!wanted.grad_q.empty()) outputs.push_back({wanted.grad_q, dq.view()});
      if (!wanted.grad_k.empty()) outputs.push_back({wanted.grad_k, dk.view()});
      if (!wanted.grad_v.empty()) outputs.push_back({wanted.grad_v, dv.view()});
      if (!wanted.grad_sinks.empty()) outputs.push_back({wanted.grad_sinks, grads.dsinks.view()});
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
