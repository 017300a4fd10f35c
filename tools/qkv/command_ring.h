// qkv attention --ring: attention across the processes of an mpirun (qkv/dist.h).
#pragma once

#include <string>

#include "cli_common.h"

namespace qkv::cli {

struct RingCommand {
  std::string q_path, k_path, v_path, out_path;
  const AttentionFlags* flags = nullptr;
  bool verbose = false;
};

// Refuses, in one usage error naming them, the flags --ring cannot take (`refused`, as the
// user spelled them), and a build without MPI; then runs the ring over MPI_COMM_WORLD (one rank
// without mpirun). Rank 0 writes --out and --lse; an error on any rank ends every rank with the
// same qkv::Error, which main prints on rank 0 only.
void run_ring_attention(const RingCommand& command, const std::string& refused);

}  // namespace qkv::cli
