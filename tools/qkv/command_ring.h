// qkv attention --ring: attention across the processes of an mpirun (qkv/dist.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "cli_common.h"
#include "qkv/dist.h"
#include "qkv/io.h"

namespace qkv::cli {

// --grad-out and where each gradient goes (empty: not wanted), --backward-kernel.
struct RingGradientPaths {
  std::string grad_out, grad_q, grad_k, grad_v, grad_sinks;
  std::string backward_kernel;
};

struct RingCommand {
  std::string q_path, k_path, v_path, out_path;
  const AttentionFlags* flags = nullptr;
  bool verbose = false;
  RingGradientPaths gradients;
};

// Refuses, in one usage error naming them, the flags --ring cannot take (`refused`, as the
// user spelled them), and a build without MPI; then runs the ring over MPI_COMM_WORLD (one rank
// without mpirun). With --grad-out, the backward over the ring follows the forward. Rank 0
// writes --out, --lse and the gradients, all or none; an error on any rank ends every rank with the
// same qkv::Error, which main prints on rank 0 only.
void run_ring_attention(const RingCommand& command, const std::string& refused);

// What qkv layer --ring shares with attention --ring:
// Refuses `refused` (one usage error naming the flags; under mpirun printed by rank 0 alone,
// before any rank exits, as "COMMAND: --ring: cannot be combined with ..."; `command` is "qkv
// attention" or "qkv layer") and a build without MPI, then runs
// `body(comm, ranks, rank)` on every rank of MPI_COMM_WORLD; an agreed error (every rank has
// it) is printed by rank 0 alone, after which every rank exits with status 1.
void run_on_ranks(const char* command, const std::string& refused,
                  const std::function<void(const dist::Communicator&, int, int)>& body);

// This rank's rows (axis -2) of the tensor `spec` names, and the file's row count in `rows`.
// Only those rows are read (read_tensor_rows: by offsets into an .npy or safetensors file or a
// stored .npz member; a deflated member is inflated as a stream, keeping them alone).
Tensor read_rows(const std::string& spec, int ranks, int rank, dist::RowLayout layout,
                 std::int64_t& rows);

// What qkv layer --ring's per-rank --max-memory check shares with attention --ring's:
// The bytes of `rows` of a tensor file's rows (axis -2), from its header.
std::uint64_t rows_share(const TensorInfo& info, std::int64_t rows);
// The most rows any rank holds of n: a K/V block in flight is that large.
std::int64_t widest_rank_rows(std::int64_t n, int ranks, dist::RowLayout layout);
// Throws qkv::Error("--max-memory", "this rank's part of the ring takes about BYTES (COUNTED);
// the memory budget is BUDGET") when bytes >= budget.
void refuse_over_budget(std::uint64_t bytes, std::uint64_t budget, const std::string& counted);

// The settings every rank of a --ring job must share (dist::agree_on_settings), compared
// before any rank computes: each input file's shape and dtype as its header gives them (paths
// may differ: node-local files), each flag that changes the computation or the outputs, and
// whether each optional output or input was given. ring_settings.cc.
std::vector<dist::Setting> attention_ring_settings(const RingCommand& command);
struct LayerCommand;
std::vector<dist::Setting> layer_ring_settings(const LayerCommand& command);

// One -v line on stderr: "WHAT: rank R/P: ..." with the ring's times.
void print_ring_times(const char* what, const dist::RingTimes& times, const std::string& kernel,
                      int threads, int rank, int ranks, std::int64_t rows, double seconds);

}  // namespace qkv::cli
