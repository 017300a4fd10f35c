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

// Every wait of src/dist: MPI_Testall polled (spinning briefly, then yielding and sleeping
// 100 µs between polls) until the requests complete or the wait limit passes
// (wait_limit_seconds). Past it the rank prints one line on stderr, "qkv: rank R: waited more
// than T s for WHAT (QKV_RING_TIMEOUT); aborting", and calls MPI_Abort on `comm`: no rank
// waits forever for one that has hung or left. Returns the seconds waited.
double wait_all(int count, MPI_Request* requests, MPI_Comm comm, const char* what);

// The collectives of src/dist, each its non-blocking form completed by wait_all.
void bounded_allreduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op,
                       MPI_Comm comm, const char* what);
void bounded_bcast(void* data, int count, MPI_Datatype type, int root, MPI_Comm comm,
                   const char* what);
void bounded_allgather(const void* send, int count, MPI_Datatype type, void* receive, MPI_Comm comm,
                       const char* what);

}  // namespace qkv::dist
