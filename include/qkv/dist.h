// qkv::dist: attention across processes. Ring attention (Liu, Zaharia, Abbeel 2023) over MPI:
// each rank keeps its own rows of Q, K and V; the K/V blocks travel once around the ring of
// ranks while every rank computes its queries against the block in hand, and the partial
// softmax states are merged by their log-sum-exp. The answer is the single-process one.
//
// This header never includes <mpi.h>: a communicator travels as its Fortran handle (MPI_Fint,
// an int in every MPI), which C code gets from MPI_Comm_c2f(comm) and mpi4py from
// comm.py2f(). In a build without MPI (CMake QKV_WITH_MPI=OFF, or MPI not found) the row
// layouts below still work; everything that needs a communicator throws qkv::Error
// ("ring: this build of qkv has no MPI").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/tensor.h"

namespace qkv::dist {

// How the rows of one sequence of n rows are spread over P ranks.
//   kContiguous: rank r holds rows [r·n/P, (r+1)·n/P) (integer division: the first ranks may
//                hold one row fewer; with n < P some ranks hold none).
//   kZigZag:     the rows cut into 2P chunks the same way, rank r holding chunks r and
//                2P-1-r (in that order). Under a causal mask every rank then has the same
//                number of visible (query, key) pairs, where contiguous blocks leave the last
//                rank P times the first one's work.
enum class RowLayout { kContiguous, kZigZag };

// Global rows [first, last).
struct RowRange {
  std::int64_t first = 0;
  std::int64_t last = 0;
  std::int64_t size() const noexcept { return last - first; }
};

// The global rows rank `rank` of `ranks` holds, in the order they are stored locally: one range
// (contiguous) or two (zig-zag); empty ranges are left out, so the list may be empty. Throws
// qkv::Error on n < 0, ranks < 1 or rank outside [0, ranks).
std::vector<RowRange> rank_rows(std::int64_t n, int ranks, int rank, RowLayout layout);
// The number of rows rank_rows() gives.
std::int64_t rank_row_count(std::int64_t n, int ranks, int rank, RowLayout layout);
// The layout the CLI uses: zig-zag under causal or a window, else contiguous.
RowLayout default_layout(const AttentionOptions& options);
const char* layout_name(RowLayout layout) noexcept;  // "contiguous" or "zigzag"

// A contiguous copy of this rank's rows of `full` along its row axis (`axis`, negative counts
// from the end: -2 for Q, K, V and O, -1 for the lse). Needs no MPI.
Tensor slice_rows(const TensorView& full, int axis, int ranks, int rank, RowLayout layout);

// Whether this build has MPI.
bool mpi_available() noexcept;

// Initialises MPI (MPI_Init_thread, MPI_THREAD_FUNNELED) unless the process already has, and
// finalises it on destruction if it initialised it. For programs (the CLI); a library caller
// (mpi4py, an MPI application) initialises MPI itself.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool owns_ = false;
};

// An MPI communicator by its Fortran handle. Cheap to copy; does not own the communicator.
class Communicator {
 public:
  // MPI_COMM_WORLD. Throws qkv::Error if MPI is not initialised or this build has no MPI.
  static Communicator world();
  // MPI_Comm_c2f(comm) in C, comm.py2f() in mpi4py.
  static Communicator from_fortran(int handle);

  int rank() const;
  int size() const;
  int fortran_handle() const noexcept { return handle_; }

 private:
  explicit Communicator(int handle) : handle_(handle) {}
  int handle_ = 0;
};

// The error agree() throws: the same on every rank, so every rank may act on it collectively.
class AgreedError : public Error {
 public:
  using Error::Error;
};

// Collective: every rank passes its own problem (empty: none). When any rank has one, every
// rank throws the same AgreedError, subject "rank R" for the lowest such rank R and its problem;
// otherwise returns on every rank.
void agree(const Communicator& comm, const std::string& problem);

// One setting every rank of a job must hold alike (a flag, an option, a file's shape): its
// name as the caller knows it ("--causal", "causal", "--k's shape") and its value in words.
struct Setting {
  std::string name;
  std::string value;
};

// Collective: every rank compares its settings, in order, with rank 0's. When any differ, every
// rank throws the same AgreedError, subject "rank R" for the lowest rank R with a difference and
// its first: "NAME differs from rank 0's: VALUE here, VALUE0 on rank 0". Every rank passes the
// same names in the same order (one build of the caller); a count or a name that differs is
// reported the same way. ring_attention and ring_attention_backward call it on their options
// before any other collective that depends on them.
void agree_on_settings(const Communicator& comm, const std::vector<Setting>& settings);

// Collective: returns once every rank of `comm` has called it.
void barrier(const Communicator& comm);

// How long any one wait of qkv::dist may last (for a neighbour's block, for a collective)
// before the waiting rank gives up on the job: QKV_RING_TIMEOUT seconds (a number > 0; read at
// each wait), 300 when unset. Past it the rank prints one line on stderr, "qkv: rank R: waited
// more than T s for WHAT (QKV_RING_TIMEOUT); aborting every rank", and calls MPI_Abort on the
// communicator (error code 1), which ends every rank of the job: no rank waits forever for one
// that has hung. Set it above the longest step a run may take (one block's kernel call).
double wait_limit_seconds();
// Empty when QKV_RING_TIMEOUT is unset or valid, else the problem with it; ring_attention and
// ring_attention_backward report it as an error (every rank agreeing) before they compute.
std::string wait_limit_problem();

struct RingOptions {
  RowLayout layout = RowLayout::kContiguous;  // how the caller spread the rows
};

// Where each rank's time went, in seconds: computing (kernel calls and merges), blocked waiting
// for the next K/V block, and the transfers in flight (posted to completed; they overlap the
// compute). Blocks this rank's queries cannot see (causal, window) are forwarded unread.
struct RingTimes {
  double compute = 0;
  double wait = 0;
  double transfer = 0;
  std::int64_t bytes_sent = 0;
  std::int64_t blocks_computed = 0;
  std::int64_t blocks_skipped = 0;
};

struct RingResult {
  Tensor out;          // this rank's rows of O, [.., n_local, Dv] in Q's rank, options.out_dtype
  Tensor lse;          // this rank's rows of the lse, [.., n_local] (only with options.return_lse)
  std::int64_t n = 0;  // the whole problem's query rows: the sum of every rank's rows of Q
  std::int64_t n_k = 0;  // and its key rows (of K and V)
  std::string kernel;    // the kernel that computed the blocks
  DType compute = DType::kF32;
  int threads = 1;
  RingTimes times;
};

// Collective over `comm`: attention over Q's nq rows and K's and V's nk rows (nq = nk for
// self-attention), each spread over comm's ranks by ring.layout (rank_rows(nq, ...) and
// rank_rows(nk, ...)). Each rank passes its own rows of Q [.., H, nq_local, D], K
// [.., Hkv, nk_local, D] and V [.., Hkv, nk_local, Dv] and gets its rows of O and the lse
// (causal and window bottom-right aligned on the whole problem, as attention() aligns them);
// equal to attention() on the whole inputs within the kernels'
// tolerance, and bitwise repeatable for a given rank count and thread count. Every option of
// attention() but the weights output and packed batches (cu_seqlens), which throw; a mask
// covers this rank's query rows and every key ([.., nq_local, nk] after broadcasting):
// causal, window and ALiBi on global positions, softcap, sinks, GQA (only the kv heads travel),
// dtype, out_dtype, scale, threads (per rank), kernel (fused_hwy, fused_scalar or reference).
// A float32 call whose scores may pass float32's range runs in float64 on every rank (unless
// options.kernel names a kernel), its O and lse returned in options.out_dtype.
// An error on any rank (bad input, shapes that disagree between ranks, a failed allocation)
// throws the same qkv::Error on every rank (agree()); no rank is left waiting.
RingResult ring_attention(const TensorView& q_local, const TensorView& k_local,
                          const TensorView& v_local, const AttentionOptions& options,
                          const Communicator& comm, const RingOptions& ring = {});

struct RingGradients {
  Tensor dq;      // this rank's rows of dQ, Q's local shape, in the compute type
  Tensor dk;      // this rank's rows of dK, K's local shape (summed over a kv head's query heads)
  Tensor dv;      // this rank's rows of dV, V's local shape
  Tensor dsinks;  // [H], the same on every rank (empty without options.sinks)
  std::int64_t n = 0;           // the whole problem's query rows
  std::int64_t n_k = 0;         // and its key rows
  std::string kernel;           // the backward kernel that computed the blocks
  DType compute = DType::kF32;  // kF32 or kF64: the gradients' dtype
  int threads = 1;
  RingTimes times;  // bytes_sent counts the K/V blocks and the dK/dV accumulators
};

// Collective over `comm`: the gradients of L = Σ O∘dO (attention_backward's, qkv/
// attention_backward.h) for the problem ring_attention spreads over the ranks, each rank
// passing its rows of Q, K, V (as for ring_attention) and of O, the lse and dO (its query rows:
// what ring_attention returned to it with return_lse, and the output's gradient) and getting its
// rows of dQ, dK and dV. The K/V blocks travel around the ring twice: first for each query
// row's softmax statistics (max, sum and D = Σ P·dP, merged block by block in a fixed order, as
// one process computes them: the saved lse is checked, not read), then with an accumulator of
// their dK and dV (ring-flash-attention's backward): at each step a rank adds its queries'
// contributions to the visiting block's dK/dV and to its own dQ, and after P steps each
// accumulator is back with its owner. dsinks sums each rank's part in rank order. Equal to
// attention_backward() on the whole inputs within the kernels' tolerance (docs/interface.md
// states it), as accurate at large scores, bitwise repeatable for a given rank count and
// thread count. Every option ring_attention takes; bf16 and f16 computation are refused as
// attention_backward refuses them; options.kernel names a tiled backward kernel (fused_hwy,
// unfused_blas or fused_scalar, which give a block's row statistics and take the whole row's;
// not the reference, which recomputes the softmax from the keys in hand). A float32 call whose
// scores or gradient sums may pass float32's range runs in float64 on every rank (unless
// options.kernel names a kernel), its gradients returned in float32. Errors as ring_attention.
RingGradients ring_attention_backward(const TensorView& q_local, const TensorView& k_local,
                                      const TensorView& v_local, const TensorView& out_local,
                                      const TensorView& lse_local, const TensorView& grad_out_local,
                                      const AttentionOptions& options, const Communicator& comm,
                                      const RingOptions& ring = {});

// Collective: the whole tensor of every rank's rows along `axis` (-2 for O, -1 for the lse),
// in global row order, on rank 0; an empty Tensor on the other ranks. Every rank's tensor must
// have the same dtype and shape but for the row axis.
Tensor gather_rows(const TensorView& local, int axis, std::int64_t n, RowLayout layout,
                   const Communicator& comm);

// Collective: the sum of every rank's `local` (float32 or float64; the same shape and dtype on
// every rank), added in rank order, ((rank 0's + rank 1's) + rank 2's) + ..., in that dtype, on
// rank 0; an empty Tensor on the other ranks. The order is fixed, unlike MPI_Reduce's, so the
// bits depend only on the parts and the rank count. What qkv layer --ring adds its weight
// gradients with (each rank's part from its rows). Rank 0 holds every rank's part at once.
Tensor sum_over_ranks(const TensorView& local, const Communicator& comm);

}  // namespace qkv::dist
