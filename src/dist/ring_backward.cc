// The backward of ring attention over MPI (qkv/dist.h): ring-flash-attention's backward (Zhu,
// 2024) on the ring of ring_attention.cc, with each row's softmax statistics merged over the
// ring first, as one process computes them (kernels/bwd_row_stats.h says why).
//
// P ranks, rank r holding its rows of Q, K, V and of O, the lse and dO (the layout's rows).
// Before the ring each rank's problem is checked and agreed as the forward's is. Two rounds.
//
// Round 1, the statistics. Step s = 0 .. P-1: rank r holds the K/V block of rank
// src = (r - s) mod P and posts its transfer on (to rank r+1; the next from rank r-1); for each
// visible (query range, key range) pair of its rows and the block's, one kernel call in its
// statistics mode (BackwardParams::stats_max/_sum/_dot) gives each row's max M, sum
// l = Σ_j exp(x_ij - M) and u = Σ_j exp(x_ij - M)·dP_ij over the pair's keys, from the scores
// the gradient call of round 2 computes (the same call, the same bits). They are merged into
// the row's running (M*, l*, u*) as an online softmax merges two partial states:
//
//   M' = max(M*, M),  l* = l*·exp(M* - M') + l·exp(M - M'),  u* likewise,  M* = M'
//
// starting from (sink_h, 1, 0) with sinks (the sink's share of the sum) or (-inf, 0, 0), in a
// fixed order (step order, then pair order), so the bits depend neither on the thread count nor
// on the run. D_i = u*/l* (Σ_j P_ij·dP_ij, as the kernels compute it in one process: it cancels
// dP exactly where one weight is 1, which D = dO·O from the saved O does not).
//
// Round 2, the gradients. Step s: the same K/V motion again (this rank's block packed anew) and,
// beside the block, the dK/dV accumulator of that block (the sum of the contributions of ranks
// src, src+1, .., r-1):
//
//   compute: for each visible pair, one backward kernel call with the masking's position
//            offsets (global positions for causal, window and ALiBi) and the whole rows'
//            statistics (BackwardParams::row_max = M*, row_sum = l*, delta = D): the kernel
//            weighs exp(x - M)·exp(M - M*)/l* with M its own max over the pair's keys, and
//            M - M* is a difference of two scores of the row as kernel calls computed them (0
//            exactly for the block holding the row's max), so no weight is taken from the saved
//            lse, which is validated but not read: dQ of the query range, dK and dV of the key
//            range; dQ added to this rank's dQ, dK/dV to the step's contribution (zeroed at the
//            first visible pair)
//   wait for the block's accumulator (from rank r-1; at s = 0 this rank starts it), add the
//   contribution, and send it on to rank r+1; post the receive of the next accumulator
//   wait for the K/V transfers
//
// After step P-1 the accumulator rank r sent holds all P contributions to block r+1 and goes to
// its owner, rank r+1; rank r receives its own. Nothing that travels depends on the thread count
// and every sum runs in a fixed order (dQ: step order, then pair order; a block's dK/dV: rank
// order src, src+1, ..; within a call the kernel's own fixed order), so the bits depend only on
// P and the thread count. A block no query of this rank can see is forwarded with its
// accumulator untouched. dsinks: each rank's -Σ_i exp(sink_h - M*_i)/l*_i·D_i over its rows,
// per (b, h) then over b as the kernels sum it, then the ranks' parts summed in rank order on
// every rank.
//
// Traffic per step: the K/V block (B·Hkv·rows·(D + Dv) elements in their storage type) in each
// round and the dK/dV accumulator (the same count in the compute type, float32 or float64) in
// the second; P accumulator messages and 2(P-1) block messages per rank. Compute: round 1 adds
// two products of a block's size (Q·Kᵀ and dO·Vᵀ) to the kernel's seven. Memory per rank: its
// rows of Q, K, V, O, dO, the lse and dQ, two K/V blocks, two accumulators, one call's dK/dV and
// the step's contribution (block sized), one dQ-sized partial, six float64 statistics per query
// row, and the kernel's workspace.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/floating_point.h"
#include "core/mask_rule.h"
#include "core/validate_backward.h"
#include "dist/mpi_comm.h"
#include "dist/ring_common.h"
#include "kernels/backward_kernel.h"
#include "kernels/blas_threads.h"
#include "kernels/kernel.h"
#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

using detail::Clock;
using detail::problem_of;
using detail::since;

constexpr int kBlockTag = 0;        // K/V blocks
constexpr int kAccumulatorTag = 1;  // dK/dV accumulators

// The tiled backward kernels, which give a call's row statistics (BackwardParams::stats_max,
// stats_sum, stats_dot) and take each row's whole statistics from the caller (row_max, row_sum,
// delta): a block's probabilities are then the whole row's. The reference recomputes the
// softmax from the keys in hand.
bool takes_row_stats(std::string_view name) {
  return name == "fused_hwy" || name == "unfused_blas" || name == "fused_scalar";
}

const kernels::BackwardKernel& ring_backward_kernel(const core::BackwardParams& p,
                                                    const std::string& requested) {
  if (!requested.empty() && !takes_row_stats(requested)) {
    throw Error("kernel " + requested,
                "the ring's backward runs fused_hwy, unfused_blas or fused_scalar (kernels that "
                "take the whole row's softmax statistics; the reference recomputes the softmax "
                "from the keys in hand)");
  }
  const kernels::BackwardKernel* last = nullptr;
  if (const auto* kernel = detail::first_accepting(kernels::backward_kernels(), p, requested,
                                                   takes_row_stats, last)) {
    return *kernel;
  }
  throw Error("ring backward", "no kernel can compute these gradients: " + last->declines(p));
}

// Everything one rank's backward ring needs, fixed before the first step.
struct Plan {
  int ranks = 1, me = 0;
  std::int64_t nq = 0, nk = 0;  // the whole problem's rows of Q and of K/V
  std::int64_t n_local = 0;     // this rank's query rows
  RowLayout layout = RowLayout::kContiguous;
  core::BackwardParams base;  // the local call: sinks removed, gradients unbound
  std::vector<RowRange> mine;
  detail::BlockGeometry kv;    // a K/V block
  detail::BlockGeometry grad;  // a dK/dV accumulator: the same rows, in the compute type
  std::int64_t max_rows = 0;   // the largest block
  const kernels::BackwardKernel* kernel = nullptr;
};

template <class T>
const T* advance(const void* data, std::int64_t elements) {
  return static_cast<const T*>(data) + elements;
}

// One rank's state through the ring: its rows' merged statistics (round 1), its dQ, the step's
// dK/dV contribution, one kernel call's outputs (round 2).
template <class T>
class BackwardRun {
 public:
  BackwardRun(const Plan& plan, const std::vector<double>& sinks) : plan_(plan) {
    const core::AttentionShape& s = plan.base.forward.shape;
    const auto dq_size = static_cast<std::size_t>(s.b * s.h * plan.n_local * s.d);
    dq_.assign(dq_size, T(0));
    dq_part_ = std::make_unique_for_overwrite<T[]>(dq_size);  // each call writes its rows
    const auto block = static_cast<std::size_t>(plan.grad.bytes(plan.max_rows)) / sizeof(T);
    part_ = std::make_unique_for_overwrite<T[]>(block);
    contribution_ = std::make_unique_for_overwrite<T[]>(block);
    const auto rows = static_cast<std::size_t>(s.b * s.h * plan.n_local);
    max_.assign(rows, -std::numeric_limits<double>::infinity());
    sum_.assign(rows, 0.0);
    dot_.assign(rows, 0.0);
    delta_.assign(rows, 0.0);
    call_max_.resize(rows);
    call_sum_.resize(rows);
    call_dot_.resize(rows);
    // The sink's share starts each row's sums, its score rounded to T as the kernels weigh it.
    sinks_.reserve(sinks.size());
    for (const double sink : sinks) sinks_.push_back(static_cast<double>(static_cast<T>(sink)));
    if (!sinks_.empty()) {
      for (std::int64_t bh = 0; bh < s.b * s.h; ++bh) {
        const auto at = static_cast<std::size_t>(bh * plan.n_local);
        std::fill_n(max_.begin() + static_cast<std::ptrdiff_t>(at), plan.n_local,
                    sinks_[static_cast<std::size_t>(bh % s.h)]);
        std::fill_n(sum_.begin() + static_cast<std::ptrdiff_t>(at), plan.n_local, 1.0);
      }
    }
  }

  // Round 1: this rank's rows against the block of rank `src`, held in `block`: each visible
  // pair's statistics merged into the rows'. `poll` runs after each kernel call (MPI progress).
  template <class Poll>
  void gather_stats(int src, const char* block, core::KernelStatus& status, Poll&& poll) {
    const core::AttentionShape& s = plan_.base.forward.shape;
    each_visible_pair(src, block, [&](core::BackwardParams& bp, std::int64_t lq,
                                      const RowRange& q) {
      bp.stats_max = call_max_.data();
      bp.stats_sum = call_sum_.data();
      bp.stats_dot = call_dot_.data();
      if (plan_.kernel->run(bp) != core::KernelStatus::kOk) {
        status = core::KernelStatus::kOutOfMemory;
      } else {
        for (std::int64_t bh = 0; bh < s.b * s.h; ++bh) {
          for (std::int64_t i = 0; i < q.size(); ++i) {
            const auto from = static_cast<std::size_t>(bh * q.size() + i);
            merge(static_cast<std::size_t>(bh * plan_.n_local + lq + i), call_max_[from],
                  call_sum_[from], call_dot_[from]);
          }
        }
      }
      poll();
    });
  }

  // After round 1: each row's D = u*/l* (0 for a row with no allowed key), and this rank's part
  // of dsinks, -Σ_i exp(sink_h - M*_i)/l*_i·D_i per (b, h) in row order, then over b (as the
  // kernels sum it).
  std::vector<double> finish_stats() {
    const core::AttentionShape& s = plan_.base.forward.shape;
    for (std::size_t row = 0; row < max_.size(); ++row) {
      delta_[row] = sum_[row] > 0.0 ? dot_[row] / sum_[row] : 0.0;
    }
    std::vector<double> dsinks(sinks_.size(), 0.0);
    for (std::size_t h = 0; h < sinks_.size(); ++h) {
      for (std::int64_t b = 0; b < s.b; ++b) {
        double part = 0.0;
        for (std::int64_t i = 0; i < plan_.n_local; ++i) {
          const auto row = static_cast<std::size_t>(
              (b * s.h + static_cast<std::int64_t>(h)) * plan_.n_local + i);
          part -= std::exp(std::min(sinks_[h] - max_[row], 0.0)) / sum_[row] * delta_[row];
        }
        dsinks[h] += part;
      }
    }
    return dsinks;
  }

  // Round 2: this rank's queries against the block of rank `src`, held in `block`: dQ added to
  // this rank's, dK/dV into the step's contribution. Returns false when no pair of the block
  // was visible (nothing computed).
  template <class Poll>
  bool compute(int src, const char* block, core::KernelStatus& status, Poll&& poll) {
    const core::AttentionShape& s = plan_.base.forward.shape;
    const std::int64_t rows = block_rows(src);
    const std::int64_t nl = plan_.n_local;
    const std::int64_t dv_at = plan_.grad.v_at(rows) / static_cast<std::int64_t>(sizeof(T));
    const DType grad = std::is_same_v<T, double> ? DType::kF64 : DType::kF32;
    const core::Strides4 per_row{s.h * nl, nl, 1, 0};
    bool any = false;
    each_visible_pair(src, block, [&](core::BackwardParams& bp, std::int64_t lq,
                                      const RowRange& q, std::int64_t lk, const RowRange& k) {
      if (!any) {
        std::fill_n(contribution_.get(), dv_at + s.b * s.hkv * rows * s.dv, T(0));
        any = true;
      }
      bp.row_max = {max_.data() + lq, DType::kF64, per_row};
      bp.row_sum = {sum_.data() + lq, DType::kF64, per_row};
      bp.delta = {delta_.data() + lq, DType::kF64, per_row};
      bp.dq = {dq_part_.get() + lq * s.d, grad,
               core::Strides4{s.h * nl * s.d, nl * s.d, s.d, 1}};
      bp.dk = {part_.get() + lk * s.d, grad,
               core::Strides4{s.hkv * rows * s.d, rows * s.d, s.d, 1}};
      bp.dv = {part_.get() + dv_at + lk * s.dv, grad,
               core::Strides4{s.hkv * rows * s.dv, rows * s.dv, s.dv, 1}};
      if (plan_.kernel->run(bp) != core::KernelStatus::kOk) {
        status = core::KernelStatus::kOutOfMemory;
      } else {
        add_rows(dq_.data(), dq_part_.get(), s.b * s.h, nl, lq, q.size(), s.d);
        add_rows(contribution_.get(), part_.get(), s.b * s.hkv, rows, lk, k.size(), s.d);
        add_rows(contribution_.get() + dv_at, part_.get() + dv_at, s.b * s.hkv, rows, lk,
                 k.size(), s.dv);
      }
      poll();
    });
    return any;
  }

  // The step's contribution into the accumulator of a block of `rows` rows: added, or copied
  // when this rank starts the accumulator (`first`); with nothing computed, zeros to start it.
  void accumulate(T* acc, std::int64_t rows, bool computed, bool first) const {
    const core::AttentionShape& s = plan_.base.forward.shape;
    const std::int64_t dv_at = plan_.grad.v_at(rows) / static_cast<std::int64_t>(sizeof(T));
    const std::int64_t end = dv_at + s.b * s.hkv * rows * s.dv;
    if (first) {
      if (computed) {
        std::copy_n(contribution_.get(), end, acc);
      } else {
        std::fill_n(acc, end, T(0));
      }
      // The padding between dK and dV travels: zero it (it is never read).
      std::fill(acc + s.b * s.hkv * rows * s.d, acc + dv_at, T(0));
      return;
    }
    if (!computed) return;
    add_rows(acc, contribution_.get(), s.b * s.hkv, rows, 0, rows, s.d);
    add_rows(acc + dv_at, contribution_.get() + dv_at, s.b * s.hkv, rows, 0, rows, s.dv);
  }

  const std::vector<T>& dq() const { return dq_; }

 private:
  std::int64_t block_rows(int src) const {
    return rank_row_count(plan_.nk, plan_.ranks, src, plan_.layout);
  }

  // f(bp, lq, q, lk, k) (or f(bp, lq, q)) for each (query range, key range) pair of this
  // rank's rows and the block of rank `src` that is visible, in pair order: bp is the pair's
  // call, its gradients and statistics unbound.
  template <class F>
  void each_visible_pair(int src, const char* block, F&& f) const {
    const Plan& plan = plan_;
    const std::vector<RowRange> theirs = rank_rows(plan.nk, plan.ranks, src, plan.layout);
    const std::int64_t rows = block_rows(src);
    std::int64_t lq = 0;
    for (const RowRange& q : plan.mine) {
      std::int64_t lk = 0;
      for (const RowRange& k : theirs) {
        if (detail::visible(plan.base.forward.masking, plan.nq, plan.nk, q, k)) {
          core::BackwardParams bp = plan.base;
          core::AttentionParams& p = bp.forward;
          p.shape.nq = q.size();
          p.shape.nk = k.size();
          const auto rows_of = [&](auto& op) {
            op.data = static_cast<const char*>(op.data) +
                      lq * op.strides.row * static_cast<std::int64_t>(dtype_size(op.dtype));
          };
          rows_of(p.q);
          rows_of(bp.out);
          rows_of(bp.lse);
          rows_of(bp.grad_out);
          detail::point_at_block(plan.kv, block, rows, lk, p.k, p.v);
          detail::set_offsets(p.masking, plan.nq, plan.nk, q, k);
          if (p.masking.mask != nullptr) {
            // The mask's rows are this rank's query rows, its columns every key.
            p.masking.mask = static_cast<const char*>(p.masking.mask) +
                             p.masking.mask_strides.at(0, 0, lq, k.first) *
                                 static_cast<std::int64_t>(dtype_size(p.masking.mask_dtype));
          }
          bp.dsinks = nullptr;
          if constexpr (std::is_invocable_v<F, core::BackwardParams&, std::int64_t,
                                            const RowRange&>) {
            f(bp, lq, q);
          } else {
            f(bp, lq, q, lk, k);
          }
        }
        lk += k.size();
      }
      lq += q.size();
    }
  }

  // One pair's statistics (m, l, u) of a row into its running state (see the top): exp(-inf)
  // = 0 takes an empty side out; equal maxima need no exponential.
  void merge(std::size_t row, double m, double l, double u) {
    if (m == -std::numeric_limits<double>::infinity()) return;  // no allowed key in the pair
    double& into_max = max_[row];
    if (m > into_max) {
      const double f = std::exp(into_max - m);
      sum_[row] = sum_[row] * f + l;
      dot_[row] = dot_[row] * f + u;
      into_max = m;
    } else {
      const double f = m == into_max ? 1.0 : std::exp(m - into_max);
      sum_[row] += l * f;
      dot_[row] += u * f;
    }
  }

  // to[g][first + r][c] += from[g][first + r][c] for `groups` groups of `stride` rows of `cols`.
  static void add_rows(T* to, const T* from, std::int64_t groups, std::int64_t stride,
                       std::int64_t first, std::int64_t count, std::int64_t cols) {
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t at = (g * stride + first) * cols;
      for (std::int64_t e = 0; e < count * cols; ++e) to[at + e] += from[at + e];
    }
  }

  const Plan& plan_;
  std::vector<double> sinks_;  // per head, rounded to T
  // Each query row's merged M*, l*, u* and D, [b][h][i] over this rank's rows; one call's.
  std::vector<double> max_, sum_, dot_, delta_;
  std::vector<double> call_max_, call_sum_, call_dot_;
  std::vector<T> dq_;
  std::unique_ptr<T[]> dq_part_;
  std::unique_ptr<T[]> part_;
  std::unique_ptr<T[]> contribution_;
};

// The ring itself (see the top). `problem` comes in holding this rank's problem so far; the
// ranks agree on it, and on their allocations, before the first step. A kernel that fails
// inside the ring leaves its problem for the caller's agreement at the end (the rank keeps
// forwarding meanwhile).
// `sinks`: per head, or empty; `dsinks` receives this rank's part of their gradients.
template <class T>
void run_ring(const Plan& plan, const Communicator& communicator, const TensorView& q,
              const TensorView& k, const TensorView& v, const std::vector<double>& sinks,
              RingGradients& result, std::vector<double>& dsinks, std::string& problem) {
  const MPI_Comm comm = mpi_comm(communicator);
  std::array<std::unique_ptr<char[]>, 2> blocks;
  std::array<std::unique_ptr<T[]>, 2> accumulators;
  std::unique_ptr<BackwardRun<T>> guarded;
  try {
    // Every rank sees the same largest block: all refuse an oversized one alike.
    const auto block_capacity =
        static_cast<std::size_t>(mpi_count(plan.kv.bytes(plan.max_rows), "a K/V block"));
    const auto grad_capacity =
        static_cast<std::size_t>(mpi_count(plan.grad.bytes(plan.max_rows), "a dK/dV accumulator"));
    // Not zero-filled: written whole by the pack, the accumulation or MPI before they are read.
    for (std::size_t i = 0; i < 2; ++i) {
      blocks[i] = std::make_unique_for_overwrite<char[]>(block_capacity);
      accumulators[i] = std::make_unique_for_overwrite<T[]>(grad_capacity / sizeof(T));
    }
    detail::pack_block(plan.kv, k, v, blocks[0].get());
    guarded = std::make_unique<BackwardRun<T>>(plan, sinks);
  } catch (const std::bad_alloc&) {
    if (problem.empty()) problem = "ring backward: out of memory allocating its blocks and state";
  } catch (const std::exception& e) {
    if (problem.empty()) problem = problem_of(e);
  }
  agree(communicator, problem);
  BackwardRun<T>& run = *guarded;
  RingTimes& times = result.times;
  core::KernelStatus status = core::KernelStatus::kOk;
  const int ranks = plan.ranks;
  const int next = (plan.me + 1) % ranks;
  const int prev = (plan.me - 1 + ranks) % ranks;
  const auto rows_of = [&](int rank) { return rank_row_count(plan.nk, ranks, rank, plan.layout); };
  const auto grad_count = [&](int rank) {
    return mpi_count(plan.grad.bytes(rows_of(rank)), "a dK/dV accumulator");
  };
  // Both rounds pass the K/V blocks the same way: at every step but the last, the block in hand
  // goes to the next rank while the previous rank's comes in. Returns whether it posted them.
  const auto move_block = [&](int step, int src, char* hand, char* coming,
                              std::array<MPI_Request, 2>& moves) {
    if (step + 1 >= ranks) return false;
    const int from = (plan.me - step - 1 + 2 * ranks) % ranks;
    const int receive = mpi_count(plan.kv.bytes(rows_of(from)), "a K/V block");
    const int send = mpi_count(plan.kv.bytes(rows_of(src)), "a K/V block");
    MPI_Irecv(coming, receive, MPI_BYTE, prev, kBlockTag, comm, &moves[0]);
    MPI_Isend(hand, send, MPI_BYTE, next, kBlockTag, comm, &moves[1]);
    times.bytes_sent += send;
    return true;
  };
  // Round 1: the K/V blocks around the ring once, each row's statistics merged in step order.
  for (int step = 0; step < ranks; ++step) {
    const int src = (plan.me - step + ranks) % ranks;
    char* const hand = blocks[static_cast<std::size_t>(step % 2)].get();
    char* const coming = blocks[static_cast<std::size_t>((step + 1) % 2)].get();
    std::array<MPI_Request, 2> moves = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    const Clock::time_point posted = Clock::now();
    const bool moving = move_block(step, src, hand, coming, moves);
    const Clock::time_point start = Clock::now();
    run.gather_stats(src, hand, status, [&] {
      int done = 0;
      if (moving) MPI_Testall(2, moves.data(), &done, MPI_STATUSES_IGNORE);
    });
    times.compute += since(start);
    if (moving) {
      times.wait += wait_all(2, moves.data(), comm, "the next K/V block");
      times.transfer += since(posted);
    }
  }
  dsinks = run.finish_stats();
  detail::pack_block(plan.kv, k, v, blocks[0].get());  // round 2 starts from this rank's block

  // Round 2. The accumulator sent at the previous step and the one being received for this step.
  MPI_Request sending = MPI_REQUEST_NULL, receiving = MPI_REQUEST_NULL;
  for (int step = 0; step < ranks; ++step) {
    const int src = (plan.me - step + ranks) % ranks;
    char* const hand = blocks[static_cast<std::size_t>(step % 2)].get();
    char* const coming = blocks[static_cast<std::size_t>((step + 1) % 2)].get();
    T* const acc = accumulators[static_cast<std::size_t>(step % 2)].get();
    T* const other = accumulators[static_cast<std::size_t>((step + 1) % 2)].get();
    std::array<MPI_Request, 2> moves = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    const Clock::time_point posted = Clock::now();
    const bool moving = move_block(step, src, hand, coming, moves);
    const Clock::time_point start = Clock::now();
    // An MPI library without a progress thread moves a large message only inside MPI calls:
    // a test between kernel calls lets the transfers advance during the step.
    const bool computed = run.compute(src, hand, status, [&] {
      int done = 0;
      if (moving) MPI_Testall(2, moves.data(), &done, MPI_STATUSES_IGNORE);
      std::array<MPI_Request, 2> grads = {sending, receiving};
      MPI_Testall(2, grads.data(), &done, MPI_STATUSES_IGNORE);
      sending = grads[0];
      receiving = grads[1];
    });
    times.compute += since(start);
    (computed ? times.blocks_computed : times.blocks_skipped) += 1;
    if (step > 0) {
      times.wait += wait_all(1, &receiving, comm, "a dK/dV accumulator from the previous rank");
    }
    const Clock::time_point adding = Clock::now();
    run.accumulate(acc, rows_of(src), computed, step == 0);
    times.compute += since(adding);
    if (ranks > 1) {
      // `other` was sent at the previous step: free once that send completes.
      times.wait += wait_all(1, &sending, comm, "the previous dK/dV accumulator's send");
      const int to_come = (plan.me - step - 1 + 2 * ranks) % ranks;
      MPI_Irecv(other, grad_count(to_come), MPI_BYTE, prev, kAccumulatorTag, comm, &receiving);
      MPI_Isend(acc, grad_count(src), MPI_BYTE, next, kAccumulatorTag, comm, &sending);
      times.bytes_sent += grad_count(src);
    }
    if (moving) {
      times.wait += wait_all(2, moves.data(), comm, "the next K/V block");
      times.transfer += since(posted);
    }
  }
  // This rank's own accumulator, after its round: in the buffer the last receive filled.
  T* own = accumulators[0].get();
  if (ranks > 1) {
    std::array<MPI_Request, 2> last = {receiving, sending};
    times.wait += wait_all(2, last.data(), comm, "this rank's dK/dV back from the ring");
    own = accumulators[static_cast<std::size_t>(ranks % 2)].get();
  }
  if (status != core::KernelStatus::kOk) {
    problem = "attention_backward: out of memory: kernel " + std::string(plan.kernel->name) +
              " could not allocate its workspace";
    return;
  }
  const DType grad = std::is_same_v<T, double> ? DType::kF64 : DType::kF32;
  const std::int64_t rows = rows_of(plan.me);
  try {
    result.dq = Tensor(grad, q.shape, "dq");
    result.dk = Tensor(grad, k.shape, "dk");
    result.dv = Tensor(grad, v.shape, "dv");
  } catch (const std::exception& e) {
    problem = problem_of(e);
    return;
  }
  std::copy(run.dq().begin(), run.dq().end(), static_cast<T*>(result.dq.data()));
  const auto dk_elements = static_cast<std::size_t>(result.dk.numel());
  std::copy_n(own, dk_elements, static_cast<T*>(result.dk.data()));
  std::copy_n(own + plan.grad.v_at(rows) / static_cast<std::int64_t>(sizeof(T)), result.dv.numel(),
              static_cast<T*>(result.dv.data()));
}

// ring_attention_backward on float64 copies of its inputs (Q, K and V through
// detail::widened_input), its gradients returned in float32 as the float32 call's would be.
RingGradients widened_ring_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& out, const TensorView& lse,
                                    const TensorView& grad_out, const AttentionOptions& options,
                                    const Communicator& comm, const RingOptions& ring) {
  const Tensor q64 = detail::widened_input(q), k64 = detail::widened_input(k),
               v64 = detail::widened_input(v);
  const Tensor out64 = contiguous_copy(out, DType::kF64), lse64 = contiguous_copy(lse, DType::kF64),
               grad_out64 = contiguous_copy(grad_out, DType::kF64);
  AttentionOptions wide = options;
  wide.dtype.reset();
  RingGradients g = ring_attention_backward(q64.view(), k64.view(), v64.view(), out64.view(),
                                            lse64.view(), grad_out64.view(), wide, comm, ring);
  g.dq = g.dq.to(DType::kF32);
  g.dk = g.dk.to(DType::kF32);
  g.dv = g.dv.to(DType::kF32);
  if (!g.dsinks.empty()) g.dsinks = g.dsinks.to(DType::kF32);
  g.compute = DType::kF32;
  return g;
}

}  // namespace

RingGradients ring_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView& lse,
                                      const TensorView& grad_out, const AttentionOptions& options,
                                      const Communicator& comm, const RingOptions& ring) {
  const core::FloatingPointScope floating_point;  // the default environment (floating_point.h)
  const MPI_Comm c = mpi_comm(comm);
  Plan plan;
  plan.ranks = comm.size();
  plan.me = comm.rank();
  plan.layout = ring.layout;
  std::string problem;
  core::BackwardCall call;
  try {
    if (options.cu_seqlens_q || options.cu_seqlens_k) {
      throw Error("cu_seqlens", "ring attention splits one sequence, not a packed batch");
    }
    if (options.dropout_p != 0.0) {
      throw Error("dropout_p", "not supported by ring attention (its ranks do not draw the mask)");
    }
    // The mask spans this rank's query rows and every key: checked once nk is known.
    AttentionOptions unmasked = options;
    unmasked.mask.reset();
    call = core::validate_attention_backward(q, k, v, out, lse, grad_out, unmasked);
    if (call.params.forward.compute == DType::kBF16) {
      throw Error("dtype", "ring attention's backward computes in float32 or float64, not "
                           "bfloat16 (ask for dtype float32)");
    }
    problem = wait_limit_problem();
  } catch (const std::exception& e) {
    problem = problem_of(e);
  }
  agree(comm, problem);
  core::BackwardParams& base = call.params;
  // Before any collective that depends on the options (the mask's agreement below).
  agree_on_settings(comm, detail::ring_settings(options, base.forward, plan.layout, false));
  const std::array<std::int64_t, 2> rows =
      detail::agree_on_shapes(q, k, v, base.forward, comm, plan.layout);
  plan.nq = rows[0];
  plan.nk = rows[1];
  plan.n_local = q.dim(-2);
  if (options.mask) {
    try {
      detail::apply_mask(q, k, v, options, plan.nk, base.forward);
    } catch (const std::exception& e) {
      problem = problem_of(e);
    }
    agree(comm, problem);
  }
  // The float32 kernels bound their sums by the inputs' magnitudes: those of every rank.
  core::Magnitudes& m = base.forward.magnitudes;
  std::array<double, 5> magnitudes = {m.q, m.k, m.v, m.mask, base.grad_out_magnitude};
  bounded_allreduce(MPI_IN_PLACE, magnitudes.data(), 5, MPI_DOUBLE, MPI_MAX, c,
                    "every rank's input magnitudes");
  m.q = magnitudes[0];
  m.k = magnitudes[1];
  m.v = magnitudes[2];
  m.mask = magnitudes[3];
  base.grad_out_magnitude = magnitudes[4];
  const std::vector<double> sinks = base.forward.modifiers.sinks;
  base.forward.modifiers.sinks.clear();  // they enter through the lse and dsinks only
  m.sink = 0;
  base.forward.progress = nullptr;
  const core::AttentionShape& s = base.forward.shape;
  const bool wide = base.forward.compute == DType::kF64;
  const DType grad = wide ? DType::kF64 : DType::kF32;
  const auto element = static_cast<std::int64_t>(dtype_size(grad));
  plan.mine = rank_rows(plan.nq, plan.ranks, plan.me, plan.layout);
  plan.kv = {s.b,
             s.hkv,
             s.d,
             s.dv,
             static_cast<std::int64_t>(dtype_size(k.dtype)),
             static_cast<std::int64_t>(dtype_size(v.dtype))};
  plan.grad = {s.b, s.hkv, s.d, s.dv, element, element};
  for (int p = 0; p < plan.ranks; ++p) {
    plan.max_rows = std::max(plan.max_rows, rank_row_count(plan.nk, plan.ranks, p, plan.layout));
  }
  plan.base = base;
  bool widen = false;
  try {
    // The choice sees the whole sequence (which bounds ALiBi's distances and the sums) and
    // gradients as the ring binds them: contiguous rows of the compute type.
    core::BackwardParams whole = base;
    whole.forward.shape.nq = plan.nq;
    whole.forward.shape.nk = plan.nk;
    static double unused = 0.0;
    const core::OutputOperand slot{&unused, grad, core::Strides4{0, 0, 0, 1}};
    whole.dq = whole.dk = whole.dv = slot;
    if (const std::string reason = kernels::backward_float64_declines(whole); !reason.empty()) {
      throw Error("attention_backward", "cannot compute these gradients: " + reason);
    }
    // Scores or gradient sums beyond float32's range: where one process would run the
    // reference, the ring computes in float64 on every rank, as its forward does for such
    // scores (each row's statistics are merged over the ring in float64, so the weights keep
    // their digits at any score: the top).
    widen = options.kernel.empty() && !wide && !kernels::backward_float32_declines(whole).empty();
    if (!widen) plan.kernel = &ring_backward_kernel(whole, options.kernel);
  } catch (const std::exception& e) {
    problem = problem_of(e);
  }
  agree(comm, problem);
  if (widen) return widened_ring_backward(q, k, v, out, lse, grad_out, options, comm, ring);
  const kernels::SingleThreadedBlas one_blas_thread;

  RingGradients result;
  result.n = plan.nq;
  result.n_k = plan.nk;
  result.kernel = std::string(plan.kernel->name);
  result.compute = grad;
  result.threads = base.forward.threads;
  std::vector<double> dsinks;
  if (wide) {
    run_ring<double>(plan, comm, q, k, v, sinks, result, dsinks, problem);
  } else {
    run_ring<float>(plan, comm, q, k, v, sinks, result, dsinks, problem);
  }
  agree(comm, problem);
  if (!sinks.empty()) {
    // Every rank's part, summed in rank order on every rank.
    std::vector<double> parts(dsinks.size() * static_cast<std::size_t>(plan.ranks));
    bounded_allgather(dsinks.data(), static_cast<int>(dsinks.size()), MPI_DOUBLE, parts.data(), c,
                      "every rank's part of dsinks");
    result.dsinks = Tensor(grad, {s.h}, "dsinks");
    for (std::int64_t h = 0; h < s.h; ++h) {
      double sum = 0.0;
      for (int r = 0; r < plan.ranks; ++r) {
        sum += parts[static_cast<std::size_t>(r) * dsinks.size() + static_cast<std::size_t>(h)];
      }
      core::store_real(result.dsinks.data(), grad, h, sum);
    }
  }
  return result;
}

}  // namespace qkv::dist
