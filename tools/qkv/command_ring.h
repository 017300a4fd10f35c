// qkv attention --ring: attention across the processes of an mpirun (qkv/dist.h).
#pragma once

#include <string>

#include "cli_common.h"

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

}  // namespace qkv::cli
