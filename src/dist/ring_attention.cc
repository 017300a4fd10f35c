// Ring attention over MPI (qkv/dist.h).
//
// P ranks, rank r holding its rows of Q (of nq) and of K and V (of nk) by one layout (rank_rows:
// one contiguous range, or two zig-zag chunks; nq = nk for self-attention). Step s = 0 .. P-1: rank
// r holds the K/V block of rank src = (r - s) mod P and computes its own queries against it while,
// in the background, it sends that block on to rank r+1 and receives the next one (rank r-s-1's)
// from rank r-1 into the other of two buffers (MPI_Isend / MPI_Irecv, completed by wait_all at
// the end of the step). Each (query range, key range) pair of the block is one call of a fused
// kernel with the masking's position offsets set (core/params.h), so that causal, window and ALiBi
// see global positions; a pair no query of the range can see is not computed, and a block with no
// visible pair is only forwarded.
//
// A kernel call gives each of its rows a normalised partial output o and its lse; as a partial
// softmax state that is max = lse, sum = 1, accumulator = o (online_softmax.h). The states merge
// into the row's running state with the kernels' merge primitive, in step order, then range
// order: a fixed order, so the bits depend only on P and the thread count. The lse is carried
// as a float max plus the sum exp(lse - max) so that no bits of it are lost to the float state.
// Sinks join once, at the end, as one more state with no value; then O = acc / sum and
// lse = max + log(sum), an all-masked row giving zeros and -inf (the sink with sinks).
//
// Traffic per step: B·Hkv·rows·(D + Dv) elements of K and V in their storage type (only kv
// heads travel under GQA); compute per step: B·H·rows²·(D + Dv) multiply-adds. Memory per rank:
// its rows of Q, K, V, O, two K/V blocks, the running state (one O-sized accumulator and a
// partial O) and the kernel's workspace.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/floating_point.h"
#include "core/mask_rule.h"
#include "core/params.h"
#include "core/validate.h"
#include "dist/mpi_comm.h"
#include "dist/ring_common.h"
#include "kernels/blas_threads.h"
#include "kernels/kernel.h"
#include "kernels/online_softmax.h"
#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

using detail::Clock;
using detail::problem_of;
using detail::since;

// The kernels that honour the masking's position offsets, in list order.
bool honours_offsets(std::string_view name) {
  return name == "fused_hwy" || name == "fused_scalar" || name == "reference";
}

const kernels::AttentionKernel& ring_kernel(const core::AttentionParams& p,
                                            const std::string& requested) {
  if (!requested.empty() && !honours_offsets(requested)) {
    throw Error("kernel " + requested, "the ring runs fused_hwy, fused_scalar or reference");
  }
  const kernels::AttentionKernel* last = nullptr;
  if (const auto* kernel = detail::first_accepting(kernels::attention_kernels(), p, requested,
                                                   honours_offsets, last)) {
    return *kernel;
  }
  return *last;  // the reference, which supports every call
}

// One row's running state and the kernels' merge, for the float32 state and the float64 one
// (the fused kernel's float64 path) alike.
template <class F>
struct Factors {
  F into = 0, part = 0;
};

template <class F>
Factors<F> merge(kernels::BasicSoftmaxState<F>& into, const kernels::BasicSoftmaxState<F>& part) {
  const auto exp = [](F x) { return std::exp(x); };
  if constexpr (std::is_same_v<F, float>) {
    const kernels::MergeFactors f = kernels::merge_states(into, part, exp);
    return {f.into, f.part};
  } else {
    // merge_states' rule on the float64 state.
    const F max = into.max > part.max ? into.max : part.max;
    const Factors<F> f{kernels::rescale_factor(into.max, max, exp),
                       kernels::rescale_factor(part.max, max, exp)};
    into.sum = f.into * into.sum + f.part * part.sum;
    into.max = max;
    return f;
  }
}

// A finished partial (its lse, double) as a state: max = lse rounded to F, sum = the rest.
template <class F>
kernels::BasicSoftmaxState<F> state_of(double lse) {
  if (!(lse > -std::numeric_limits<double>::infinity())) return {};
  const F max = static_cast<F>(lse);
  if (std::isinf(max)) return {max, F{1}};
  return {max, static_cast<F>(std::exp(lse - static_cast<double>(max)))};
}

// Everything one rank's ring run needs, fixed before the first step.
struct Plan {
  int ranks = 1, me = 0;
  std::int64_t nq = 0, nk = 0;  // the whole problem's rows of Q and of K/V
  RowLayout layout = RowLayout::kContiguous;
  core::AttentionParams base;  // the local call: sinks removed, outputs unbound
  std::vector<double> sinks;
  std::vector<RowRange> mine;  // this rank's global rows
  std::int64_t n_local = 0;
  const kernels::AttentionKernel* kernel = nullptr;
  std::size_t k_elem = 4, v_elem = 4;
};

// How a K/V block of the plan lies in memory (ring_common.h, shared with the backward ring).
detail::BlockGeometry geometry(const Plan& plan) {
  const core::AttentionShape& s = plan.base.shape;
  return {s.b,
          s.hkv,
          s.d,
          s.dv,
          static_cast<std::int64_t>(plan.k_elem),
          static_cast<std::int64_t>(plan.v_elem)};
}

std::int64_t block_bytes(const Plan& plan, std::int64_t rows) { return geometry(plan).bytes(rows); }

// The query rows of one kernel call: a block's partial output is merged chunk by chunk, so that
// its buffer holds this many rows per head (not the rank's whole output). Each call packs the
// block's K^T and V again, O(block rows · d) beside the chunk's O(chunk · block rows · d) work.
constexpr std::int64_t kChunkRows = 512;

// The merge of one rank's partial results. Its running accumulator is the output tensor itself
// (rows [b, h, i] of dv values, F as the output), normalised in place by finish(); each kernel
// call writes a chunk of at most kChunkRows query rows into the part buffers, merged at once.
// Memory beyond the output: the running (max, sum) per row and the part buffers.
template <class F>
class RingRun {
 public:
  RingRun(const Plan& plan, F* acc) : plan_(plan), acc_(acc) {
    const core::AttentionShape& s = plan.base.shape;
    rows_ = s.b * s.h * plan.n_local;
    chunk_ = std::max<std::int64_t>(1, std::min(kChunkRows, plan.n_local));
    states_.resize(static_cast<std::size_t>(rows_));
    std::fill(acc_, acc_ + rows_ * s.dv, F{0});
    const std::int64_t part_rows = s.b * s.h * chunk_;
    part_out_ = std::make_unique_for_overwrite<F[]>(static_cast<std::size_t>(part_rows * s.dv));
    part_lse_.resize(static_cast<std::size_t>(part_rows));
  }

  // The queries of this rank against the block of rank `src`, held in `block`; `poll` runs
  // after each kernel call (MPI progress for the transfers in flight). Returns false when no
  // pair of the block was visible (nothing computed).
  template <class Poll>
  bool compute(int src, const char* block, core::KernelStatus& status, Poll&& poll) {
    const Plan& plan = plan_;
    const core::AttentionShape& s = plan.base.shape;
    const std::vector<RowRange> theirs = rank_rows(plan.nk, plan.ranks, src, plan.layout);
    std::int64_t block_rows = 0;
    for (const RowRange& r : theirs) block_rows += r.size();
    const detail::BlockGeometry kv = geometry(plan);
    bool any = false;
    std::int64_t lq = 0;
    for (const RowRange& whole : plan.mine) {
      std::int64_t lk = 0;
      for (const RowRange& k : theirs) {
        if (!detail::visible(plan.base.masking, plan.nq, plan.nk, whole, k)) {
          lk += k.size();
          continue;
        }
        any = true;
        for (std::int64_t c0 = 0; c0 < whole.size(); c0 += chunk_) {
          const RowRange q{whole.first + c0, std::min(whole.last, whole.first + c0 + chunk_)};
          if (!detail::visible(plan.base.masking, plan.nq, plan.nk, q, k)) continue;
          const std::int64_t lc = lq + c0;  // the chunk's first local row
          core::AttentionParams p = plan.base;
          p.shape.nq = q.size();
          p.shape.nk = k.size();
          p.q.data = static_cast<const char*>(p.q.data) +
                     lc * p.q.strides.row * static_cast<std::int64_t>(dtype_size(p.q.dtype));
          detail::point_at_block(kv, block, block_rows, lk, p.k, p.v);
          // Global positions: query row i at q.first + i, key row j at k.first + j.
          detail::set_offsets(p.masking, plan.nq, plan.nk, q, k);
          if (p.masking.mask != nullptr) {
            // The mask's rows are this rank's query rows, its columns every key.
            p.masking.mask = static_cast<const char*>(p.masking.mask) +
                             p.masking.mask_strides.at(0, 0, lc, k.first) *
                                 static_cast<std::int64_t>(dtype_size(p.masking.mask_dtype));
          }
          p.out = {part_out_.get(), std::is_same_v<F, double> ? DType::kF64 : DType::kF32,
                   core::Strides4{s.h * chunk_ * s.dv, chunk_ * s.dv, s.dv, 1}};
          p.lse = {part_lse_.data(), DType::kF64, core::Strides4{s.h * chunk_, chunk_, 1, 0}};
          if (plan.kernel->run(p) != core::KernelStatus::kOk) {
            status = core::KernelStatus::kOutOfMemory;
          } else {
            merge_rows(lc, q.size());
          }
          poll();
        }
        lk += k.size();
      }
      lq += whole.size();
    }
    return any;
  }

  // O (normalised in place: the accumulator is the output) and the lse of this rank's rows,
  // the sinks merged in.
  void finish(Tensor& lse) {
    const core::AttentionShape& s = plan_.base.shape;
    auto* l = lse.empty() ? nullptr : static_cast<double*>(lse.data());
    for (std::int64_t r = 0; r < rows_; ++r) {
      auto& st = states_[static_cast<std::size_t>(r)];
      F* acc = acc_ + r * s.dv;
      if (!plan_.sinks.empty()) {
        const std::int64_t h = (r / plan_.n_local) % s.h;
        const Factors<F> f = merge(st, state_of<F>(plan_.sinks[static_cast<std::size_t>(h)]));
        for (std::int64_t c = 0; c < s.dv; ++c) acc[c] *= f.into;
      }
      const F inv = kernels::inverse_sum(st);
      for (std::int64_t c = 0; c < s.dv; ++c) acc[c] *= inv;
      if (l != nullptr) l[r] = kernels::log_sum_exp(st);
    }
  }

 private:
  // Merges the part buffers' rows (a chunk of `count` rows from local row lq) into the state.
  void merge_rows(std::int64_t lq, std::int64_t count) {
    const core::AttentionShape& s = plan_.base.shape;
    for (std::int64_t bh = 0; bh < s.b * s.h; ++bh) {
      for (std::int64_t i = 0; i < count; ++i) {
        const std::int64_t r = bh * plan_.n_local + lq + i;
        const std::int64_t pr = bh * chunk_ + i;
        const auto part = state_of<F>(part_lse_[static_cast<std::size_t>(pr)]);
        const Factors<F> f = merge(states_[static_cast<std::size_t>(r)], part);
        F* acc = acc_ + r * s.dv;
        const F* o = part_out_.get() + pr * s.dv;
        const F w = f.part * part.sum;
        for (std::int64_t c = 0; c < s.dv; ++c) acc[c] = f.into * acc[c] + w * o[c];
      }
    }
  }

  const Plan& plan_;
  F* acc_;                  // the output's rows, rows_ x dv
  std::int64_t rows_ = 0;   // b · h · n_local
  std::int64_t chunk_ = 1;  // query rows per kernel call
  std::vector<kernels::BasicSoftmaxState<F>> states_;
  std::unique_ptr<F[]> part_out_;  // b · h · chunk_ rows of dv; the kernel writes what it uses
  std::vector<double> part_lse_;
};

// The ring itself: P steps, each computing on the block in hand while the next travels.
// `problem` comes in holding this rank's problem so far (empty: none); the ranks agree on it,
// and on their allocations, before the first step, so that no rank waits in the ring for one
// that has left it. A kernel that fails inside the ring leaves its problem there for the
// caller's agreement at the end (the rank keeps forwarding blocks meanwhile).
template <class F>
void run_ring(const Plan& plan, const Communicator& communicator, const TensorView& k,
              const TensorView& v, Tensor& out, Tensor& lse, RingTimes& times,
              std::string& problem) {
  const MPI_Comm comm = mpi_comm(communicator);
  // Not zero-filled: step 0's block is written whole below, the others are received whole
  // (zero-filling them, and the merge's part buffer, was ~0.1 s of page faults per call).
  std::array<std::unique_ptr<char[]>, 2> buffers;
  std::unique_ptr<RingRun<F>> guarded;
  try {
    std::int64_t max_rows = 0;
    for (int p = 0; p < plan.ranks; ++p) {
      max_rows = std::max(max_rows, rank_row_count(plan.nk, plan.ranks, p, plan.layout));
    }
    // Every rank sees the same largest block: all refuse an oversized one alike.
    const auto capacity =
        static_cast<std::size_t>(mpi_count(block_bytes(plan, max_rows), "a K/V block"));
    buffers = {std::make_unique_for_overwrite<char[]>(capacity),
               std::make_unique_for_overwrite<char[]>(capacity)};
    // The block's K then V (at a 64-byte boundary), rows contiguous, the padding zeroed.
    detail::pack_block(geometry(plan), k, v, buffers[0].get());
    // The output was allocated by the caller unless `problem` says otherwise.
    if (problem.empty()) guarded = std::make_unique<RingRun<F>>(plan, static_cast<F*>(out.data()));
  } catch (const std::bad_alloc&) {
    if (problem.empty()) problem = "ring: out of memory allocating its K/V blocks and state";
  } catch (const std::exception& e) {
    if (problem.empty()) problem = problem_of(e);
  }
  agree(communicator, problem);
  RingRun<F>& run = *guarded;
  core::KernelStatus status = core::KernelStatus::kOk;
  const int next = (plan.me + 1) % plan.ranks;
  const int prev = (plan.me - 1 + plan.ranks) % plan.ranks;
  for (int step = 0; step < plan.ranks; ++step) {
    const int src = (plan.me - step + plan.ranks) % plan.ranks;
    char* const hand = buffers[static_cast<std::size_t>(step % 2)].get();
    char* const coming = buffers[static_cast<std::size_t>((step + 1) % 2)].get();
    std::array<MPI_Request, 2> requests = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    const Clock::time_point posted = Clock::now();
    const bool moving = step + 1 < plan.ranks;
    if (moving) {
      const int from = (plan.me - step - 1 + 2 * plan.ranks) % plan.ranks;
      const int receive = mpi_count(
          block_bytes(plan, rank_row_count(plan.nk, plan.ranks, from, plan.layout)), "a K/V block");
      const int send = mpi_count(
          block_bytes(plan, rank_row_count(plan.nk, plan.ranks, src, plan.layout)), "a K/V block");
      MPI_Irecv(coming, receive, MPI_BYTE, prev, step, comm, &requests[0]);
      MPI_Isend(hand, send, MPI_BYTE, next, step, comm, &requests[1]);
      times.bytes_sent += send;
    }
    const Clock::time_point start = Clock::now();
    // An MPI library without a progress thread moves a large message only inside MPI calls:
    // a test between kernel calls lets the transfer advance during the step.
    const bool computed = run.compute(src, hand, status, [&] {
      if (!moving) return;
      int done = 0;
      MPI_Testall(2, requests.data(), &done, MPI_STATUSES_IGNORE);
    });
    times.compute += since(start);
    (computed ? times.blocks_computed : times.blocks_skipped) += 1;
    if (moving) {
      times.wait += wait_all(2, requests.data(), comm, "the next K/V block");
      times.transfer += since(posted);
    }
  }
  if (status != core::KernelStatus::kOk) {
    problem = "attention: out of memory: kernel " + std::string(plan.kernel->name) +
              " could not allocate its workspace";
    return;
  }
  run.finish(lse);
}

}  // namespace

namespace {

// ring_attention on float64 copies of Q, K and V (detail::widened_input), its output and lse
// returned in options.out_dtype as the float32 call's would be.
RingResult widened_ring_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const AttentionOptions& options, const Communicator& comm,
                                  const RingOptions& ring) {
  const Tensor q64 = detail::widened_input(q), k64 = detail::widened_input(k),
               v64 = detail::widened_input(v);
  AttentionOptions wide = options;
  wide.dtype.reset();
  return ring_attention(q64.view(), k64.view(), v64.view(), wide, comm, ring);
}

}  // namespace

RingResult ring_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttentionOptions& options, const Communicator& comm,
                          const RingOptions& ring) {
  const core::FloatingPointScope floating_point;  // the default environment (floating_point.h)
  const MPI_Comm c = mpi_comm(comm);
  Plan plan;
  plan.ranks = comm.size();
  plan.me = comm.rank();
  plan.layout = ring.layout;
  std::string problem;
  core::AttentionCall call;
  try {
    if (options.return_weights) throw Error("weights", "ring attention returns no weights");
    if (options.cu_seqlens_q || options.cu_seqlens_k) {
      throw Error("cu_seqlens", "ring attention splits one sequence, not a packed batch");
    }
    if (options.dropout_p != 0.0) {
      throw Error("dropout_p", "not supported by ring attention (its ranks do not draw the mask)");
    }
    if (options.out_dtype != DType::kF32 && options.out_dtype != DType::kF64 &&
        options.out_dtype != DType::kF16) {
      throw Error("out_dtype", "must be float32, float64 or float16");
    }
    // The mask spans this rank's query rows and every key: it is checked below, once the
    // key count is known.
    AttentionOptions unmasked = options;
    unmasked.mask.reset();
    call = core::validate_attention(q, k, v, unmasked);
    problem = wait_limit_problem();
  } catch (const std::exception& e) {
    problem = problem_of(e);
  }
  agree(comm, problem);
  // Before any collective that depends on the options (the mask's agreement below).
  agree_on_settings(comm, detail::ring_settings(options, call.params, plan.layout, true));

  const std::array<std::int64_t, 2> rows =
      detail::agree_on_shapes(q, k, v, call.params, comm, plan.layout);
  plan.nq = rows[0];
  plan.nk = rows[1];
  plan.n_local = q.dim(-2);

  core::AttentionParams& base = call.params;
  if (options.mask) {
    try {
      detail::apply_mask(q, k, v, options, plan.nk, base);
    } catch (const std::exception& e) {
      problem = problem_of(e);
    }
    agree(comm, problem);
  }
  // The float32 kernels bound their scores by the inputs' magnitudes: those of every rank.
  std::array<double, 3> magnitudes = {base.magnitudes.q, base.magnitudes.k, base.magnitudes.v};
  bounded_allreduce(MPI_IN_PLACE, magnitudes.data(), 3, MPI_DOUBLE, MPI_MAX, c,
                    "every rank's input magnitudes");
  base.magnitudes.q = magnitudes[0];
  base.magnitudes.k = magnitudes[1];
  base.magnitudes.v = magnitudes[2];
  plan.sinks = base.modifiers.sinks;
  base.modifiers.sinks.clear();
  base.magnitudes.sink = 0;
  base.progress = nullptr;
  plan.mine = rank_rows(plan.nq, plan.ranks, plan.me, plan.layout);
  plan.k_elem = dtype_size(k.dtype);
  plan.v_elem = dtype_size(v.dtype);
  plan.base = base;
  bool widen = false;
  try {
    // The choice sees the whole sequence's length, which bounds ALiBi's distances.
    core::AttentionParams whole = base;
    whole.shape.nq = plan.nq;
    whole.shape.nk = plan.nk;
    // Scores beyond float32's range: the float32 partial states and their merge would
    // overflow, so the ring computes in float64 (the reference's float32 path would not help).
    widen = options.kernel.empty() && base.compute == DType::kF32 &&
            !kernels::float32_declines(whole).empty();
    if (!widen) plan.kernel = &ring_kernel(whole, options.kernel);
  } catch (const std::exception& e) {
    problem = problem_of(e);
  }
  agree(comm, problem);
  if (widen) return widened_ring_attention(q, k, v, options, comm, ring);
  const kernels::SingleThreadedBlas one_blas_thread;

  RingResult result;
  result.n = plan.nq;
  result.n_k = plan.nk;
  result.kernel = std::string(plan.kernel->name);
  result.compute = base.compute;
  result.threads = base.threads;
  const bool wide = base.compute == DType::kF64;
  Tensor out, lse;
  try {
    out = Tensor(wide ? DType::kF64 : DType::kF32, call.out_shape, "output");
    if (options.return_lse) lse = Tensor(DType::kF64, call.lse_shape, "lse");
  } catch (const std::exception& e) {
    problem = problem_of(e);
  }
  // run_ring agrees on `problem` before its first step, and throws if any rank has one.
  if (wide) {
    run_ring<double>(plan, comm, k, v, out, lse, result.times, problem);
  } else {
    run_ring<float>(plan, comm, k, v, out, lse, result.times, problem);
  }
  agree(comm, problem);
  result.out = out.dtype() == options.out_dtype ? std::move(out) : out.to(options.out_dtype);
  if (!lse.empty()) result.lse = lse.to(options.out_dtype);
  return result;
}

}  // namespace qkv::dist
