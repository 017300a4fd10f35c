// A build without MPI (QKV_WITH_MPI=OFF or MPI not found): the ring's entry points say so.
#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

[[noreturn]] void no_mpi() { throw Error("ring", "this build of qkv has no MPI"); }

}  // namespace

bool mpi_available() noexcept { return false; }

MpiSession::MpiSession(int*, char***) {}
MpiSession::~MpiSession() = default;

Communicator Communicator::world() { no_mpi(); }
Communicator Communicator::from_fortran(int) { no_mpi(); }
int Communicator::rank() const { return 0; }
int Communicator::size() const { return 1; }

void agree(const Communicator&, const std::string&) { no_mpi(); }
void agree_on_settings(const Communicator&, const std::vector<Setting>&) { no_mpi(); }
void barrier(const Communicator&) { no_mpi(); }

RingResult ring_attention(const TensorView&, const TensorView&, const TensorView&,
                          const AttentionOptions&, const Communicator&, const RingOptions&) {
  no_mpi();
}

RingGradients ring_attention_backward(const TensorView&, const TensorView&, const TensorView&,
                                      const TensorView&, const TensorView&, const TensorView&,
                                      const AttentionOptions&, const Communicator&,
                                      const RingOptions&) {
  no_mpi();
}

Tensor gather_rows(const TensorView&, int, std::int64_t, RowLayout, const Communicator&) {
  no_mpi();
}

Tensor sum_over_ranks(const TensorView&, const Communicator&) { no_mpi(); }

}  // namespace qkv::dist
