// The MPI side of qkv::dist::Communicator (src/dist only: the one place that includes <mpi.h>).
#pragma once

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <string>

#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::dist {

inline MPI_Comm mpi_comm(const Communicator& comm) {
  return MPI_Comm_f2c(static_cast<MPI_Fint>(comm.fortran_handle()));
}

// MPI counts are int: a larger message is refused rather than truncated.
inline int mpi_count(std::int64_t bytes, const char* what) {
  if (bytes < 0 || bytes > INT_MAX) {
    throw Error("ring", std::string(what) + " of " + std::to_string(bytes) +
                            " bytes exceeds MPI's int count; use more ranks");
  }
  return static_cast<int>(bytes);
}

}  // namespace qkv::dist
