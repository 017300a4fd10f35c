// qkv layer --ring: the multi-head layer across the processes of an mpirun. Each rank reads its
// rows of X (and of DY), projects them (the projections are row-local), runs the attention and
// its backward as ring attention (qkv/dist.h) in the layer's attention steps, and rank 0 gathers
// the output rows and dX and sums the weight gradients in rank order, then writes through the
// all-or-nothing output path.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "command_layer.h"
#include "command_ring.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/layer.h"
#include "qkv/layer_backward.h"

namespace qkv::cli {
namespace {

// `to` = `from`, both of one shape and dtype; `to` any strides, `from` contiguous.
void copy_into(const Tensor& from, const MutableTensorView& to) {
  const std::size_t element = dtype_size(to.dtype);
  const auto* source = static_cast<const char*>(from.data());
  const std::size_t rank = to.shape.size();
  std::vector<std::int64_t> index(rank, 0);
  std::int64_t offset = 0;
  for (std::int64_t e = 0; e < from.numel(); ++e) {
    std::memcpy(static_cast<char*>(to.data) + offset * static_cast<std::int64_t>(element),
                source + e * static_cast<std::int64_t>(element), element);
    for (std::size_t axis = rank; axis-- > 0;) {
      offset += to.strides[axis];
      if (++index[axis] < to.shape[axis]) break;
      offset -= to.strides[axis] * to.shape[axis];
      index[axis] = 0;
    }
  }
}

// A tensor file's elements, from its header.
std::uint64_t elements(const TensorInfo& info) {
  return static_cast<std::uint64_t>(shape_numel(info.shape, info.name));
}

// Refuses, from the files' headers and before X, DY or the weights are read, a rank whose part
// of qkv layer --ring would pass the --max-memory budget (each rank holds it alone, as in
// attention --ring's check_rank_budget). Counted, in the compute type (float64 when X or a
// weight is, else float32): every weight as read and as converted, the mask, its rows of X and
// of the projections Q, K, V, the heads' concatenation (and the ring's copy of it) and the
// output, the lse, the two K/V blocks in flight (the widest rank's rows); with gradients also its
// rows of DY, dConcat, dQ, dK and dV (the ring's and as rows), dX, the two dK/dV accumulators in
// flight and the weight gradients; on rank 0 the gathered output (and dX) and every rank's part
// of the weight gradients, which it sums. The kernels' tiles come on top. A file that cannot be
// inspected is left to the reads, which say why.
void check_layer_rank_budget(const LayerCommand& command, int ranks, int me,
                             dist::RowLayout layout) {
  const std::uint64_t budget = memory_budget(command.flags);
  if (budget == 0) return;
  const WeightFlags& w = command.weights;
  const bool gradients = command.gradients.wanted();
  TensorInfo x, dy;
  std::uint64_t weight_bytes = 0, weight_elements = 0, mask_bytes = 0;
  std::uint64_t q_width = 0, k_width = 0, v_width = 0, out_width = 0;
  bool wide = false;
  std::uint64_t bytes = 0;
  try {
    x = inspect_input(command.x_path);
    if (gradients) dy = inspect_input(command.gradients.grad_out);
    if (!command.flags.mask_path.empty()) mask_bytes = inspect_input(command.flags.mask_path).bytes;
    const std::int64_t d = x.shape.empty() ? 0 : x.shape.back();
    const std::int64_t heads = w.heads, kv_heads = w.kv_heads == 0 ? w.heads : w.kv_heads;
    if (x.shape.size() < 2 || d <= 0 || heads <= 0 || kv_heads <= 0) return;
    wide = x.dtype == DType::kF64;
    const auto width_of = [&](const std::string& spec, std::uint64_t rows_in) -> std::uint64_t {
      if (spec.empty() || rows_in == 0) return 0;
      return elements(inspect_input(spec)) / rows_in;
    };
    for (const std::string& spec : weight_specs(w)) {
      if (spec.empty()) continue;
      const TensorInfo info = inspect_input(spec);
      weight_bytes += info.bytes;
      weight_elements += elements(info);
      wide = wide || info.dtype == DType::kF64;
    }
    // Widths from element counts: the same in either layout (--linear-layout).
    const auto ud = static_cast<std::uint64_t>(d);
    if (!w.wqkv.empty()) {
      const std::uint64_t dk =
          width_of(w.wqkv, ud) / static_cast<std::uint64_t>(heads + 2 * kv_heads);
      q_width = static_cast<std::uint64_t>(heads) * dk;
      k_width = v_width = static_cast<std::uint64_t>(kv_heads) * dk;
    } else {
      q_width = width_of(w.wq, ud);
      k_width = width_of(w.wk, ud);
      v_width = width_of(w.wv, ud);
    }
    const std::uint64_t concat_width =
        v_width / static_cast<std::uint64_t>(kv_heads) * static_cast<std::uint64_t>(heads);
    out_width = w.wo.empty() ? concat_width : width_of(w.wo, concat_width);
    std::uint64_t batch = 1;
    for (std::size_t i = 0; i + 2 < x.shape.size(); ++i)
      batch *= static_cast<std::uint64_t>(x.shape[i]);
    const std::int64_t n = x.shape[x.shape.size() - 2];
    const std::uint64_t e = wide ? 8 : 4;
    const auto mine = static_cast<std::uint64_t>(dist::rank_row_count(n, ranks, me, layout));
    const std::uint64_t rows = batch * mine;
    const std::uint64_t block_rows =
        batch * static_cast<std::uint64_t>(widest_rank_rows(n, ranks, layout));
    const std::uint64_t all_rows = batch * static_cast<std::uint64_t>(n);
    const auto lse_rows = [&](std::uint64_t r) {
      return r * static_cast<std::uint64_t>(heads) * 8;
    };
    bytes = weight_bytes + weight_elements * e + mask_bytes +
            rows_share(x, static_cast<std::int64_t>(mine)) +
            rows * (ud + q_width + k_width + v_width + 2 * concat_width + out_width) * e +
            lse_rows(rows) + 2 * block_rows * (k_width + v_width) * e;
    if (me == 0) bytes += all_rows * out_width * e + lse_rows(all_rows);
    if (gradients) {
      if (dy.shape.size() >= 2) bytes += rows_share(dy, static_cast<std::int64_t>(mine));
      bytes += rows * (out_width + concat_width + 2 * (q_width + k_width + v_width) + ud) * e +
               2 * block_rows * (k_width + v_width) * e + weight_elements * e;
      if (me == 0) {
        bytes += all_rows * ud * e + static_cast<std::uint64_t>(ranks) * weight_elements * e;
      }
    }
  } catch (const Error&) {
    return;
  }
  refuse_over_budget(
      bytes, budget,
      "its rows of X, of the projections and of the output, the weights, two K/V blocks in "
      "flight" +
          std::string(gradients ? ", the gradients of its rows and of the weights" : "") +
          std::string(me == 0 ? (gradients ? " and the gathered output, dX and every rank's "
                                             "weight gradients"
                                           : " and the gathered output")
                              : ""));
}

// dY's rows must be those of the layer's output: X's rows, d_out columns (W^O's, or H·dv).
void check_grad_out_shape(const std::string& spec, const Shape& x_shape,
                          const LayerWeights& weights, const LayerOptions& options) {
  const std::int64_t heads = options.heads;
  const std::int64_t kv_heads = options.kv_heads == 0 ? heads : options.kv_heads;
  // Weights the layer would refuse are left to it: it says why.
  if (heads <= 0 || kv_heads <= 0 || x_shape.empty() || weights.wv.rank() != 2 ||
      (weights.wo && weights.wo->rank() != 2)) {
    return;
  }
  Shape expected = x_shape;
  expected.back() = weights.wo ? weights.wo->dim(1) : heads * (weights.wv.dim(1) / kv_heads);
  const Shape shape = inspect_input(spec).shape;
  if (shape != expected) {
    throw Error(spec, "shape " + shape_string(shape) + " should be " + shape_string(expected) +
                          " (the layer's output)");
  }
}

}  // namespace

std::string layer_ring_refusals(const LayerCommand& c) {
  std::string refused;
  const auto refuse = [&](bool given, const char* flag) {
    if (given) refused += (refused.empty() ? "" : ", ") + std::string(flag);
  };
  refuse(!c.memory_path.empty(), "--memory");
  refuse(!c.flags.weights_path.empty(), "--weights");
  refuse(!c.flags.cu_seqlens_q_path.empty(), "--cu-seqlens-q");
  refuse(!c.flags.cu_seqlens_k_path.empty(), "--cu-seqlens-k");
  // As for attention --ring: the ranks would each draw their own blocks' masks.
  refuse(c.flags.dropout != 0.0, "--dropout");
  return refused;
}

// qkv layer --ring on this rank: its rows of X projected (the projections are row-local), the
// attention over the ring (ring attention as the layer's attention step), its rows of the
// output projected; with --grad-out the backward the same way (the ring's backward as the
// layer's backward attention step), dX row-local, the weights' and biases' gradients each
// rank's part summed in rank order on rank 0 (dist::sum_over_ranks: the bits do not depend on
// --threads). Rank 0 gathers and writes, all or none. Every rank agrees on success before the
// ring, after the forward, after the backward and after writing.
void run_layer_ring(const LayerCommand& command, const dist::Communicator& comm, int ranks,
                    int me) {
  const LayerGradientFlags& wanted = command.gradients;
  const bool gradients = wanted.wanted();
  std::string problem;
  Tensor x, grad_out;
  LoadedWeights loaded;
  AttentionTensors tensors;
  LayerOptions options;
  DType out_dtype = DType::kF32;
  dist::RowLayout layout = dist::RowLayout::kContiguous;
  std::int64_t n = 0;
  std::vector<dist::Setting> settings;
  try {
    settings = layer_ring_settings(command);
    check_gradient_flags(command);
    check_weight_flags(command.weights);
    tensors = load_attention_tensors(command.flags);
    options.heads = command.weights.heads;
    options.kv_heads = command.weights.kv_heads;
    options.attention = attention_options(command.flags, tensors);
    layout = dist::default_layout(options.attention);
    check_layer_rank_budget(command, ranks, me, layout);
    load_weights(command.weights, loaded);
    x = read_rows(command.x_path, ranks, me, layout, n);
    if (gradients) {
      check_grad_out_shape(wanted.grad_out, inspect_input(command.x_path).shape, loaded.weights,
                           options);
      std::int64_t n_grad = 0;
      grad_out = read_rows(wanted.grad_out, ranks, me, layout, n_grad);
    }
    // The mask: this rank's query rows (unless that axis broadcasts), every key.
    if (tensors.mask && tensors.mask->shape().size() >= 2) {
      const Shape& shape = tensors.mask->shape();
      if (shape[shape.size() - 2] == n && n != 1) {
        tensors.mask = dist::slice_rows(tensors.mask->view(), -2, ranks, me, layout);
      }
    }
    options.attention = attention_options(command.flags, tensors);
    options.attention.return_lse = !command.flags.lse_path.empty();
    options.attention.max_memory = 0;  // the rank's budget was checked above
    out_dtype = options.attention.out_dtype;
    if (out_dtype == DType::kF16) options.attention.out_dtype = DType::kF32;
  } catch (const std::exception& e) {
    problem = e.what();
  }
  dist::agree(comm, problem);
  // Before any collective that depends on the flags (the ring's, the gathers, the sums).
  dist::agree_on_settings(comm, settings);

  bool attended = false;
  dist::RingResult ring;
  const AttentionStep step = [&](const TensorView& q, const TensorView& k, const TensorView& v,
                                 const AttentionOptions& o, const AttentionOutputs& outputs) {
    attended = true;
    AttentionOptions ring_options = o;
    ring_options.out_dtype = outputs.out.dtype;
    ring_options.return_lse = outputs.lse.has_value();
    ring = dist::ring_attention(q, k, v, ring_options, comm, {layout});
    copy_into(ring.out, outputs.out);
    if (outputs.lse) copy_into(ring.lse.to(outputs.lse->dtype), *outputs.lse);
    return ring.kernel;
  };
  const auto start = std::chrono::steady_clock::now();
  LayerResult result;
  LayerForwardState state;
  try {
    result = gradients ? multi_head_attention(x.view(), loaded.weights, options, step, state)
                       : multi_head_attention(x.view(), loaded.weights, options, step);
  } catch (const dist::AgreedError&) {
    throw;
  } catch (const std::exception& e) {
    problem = e.what();
  }
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  // A rank whose projections failed never reached the ring: its agreement stands in for the
  // ring's first one, which the other ranks are in.
  if (!attended) dist::agree(comm, problem.empty() ? "the layer: no attention step" : problem);
  dist::agree(comm, problem);

  LayerGradients grads;
  dist::RingGradients ring_grads;
  std::chrono::duration<double> backward_seconds{0};
  if (gradients) {
    bool stepped = false;
    const AttentionBackwardStep backward_step = [&](const TensorView& q, const TensorView& k,
                                                    const TensorView& v, const TensorView& o,
                                                    const TensorView& lse, const TensorView& grad_o,
                                                    const AttentionOptions& opts) {
      stepped = true;
      AttentionOptions backward = opts;
      // --kernel names the forward's kernel; the ring's backward chooses among the tiled ones
      // (which take the whole row's softmax statistics).
      backward.kernel.clear();
      ring_grads = dist::ring_attention_backward(q, k, v, o, lse, grad_o, backward, comm, {layout});
      AttentionGradients a;
      a.dq = std::move(ring_grads.dq);
      a.dk = std::move(ring_grads.dk);
      a.dv = std::move(ring_grads.dv);
      a.dsinks = std::move(ring_grads.dsinks);  // already summed over the ranks
      a.kernel = ring_grads.kernel;
      a.compute = ring_grads.compute;
      a.threads = ring_grads.threads;
      return a;
    };
    const auto begin = std::chrono::steady_clock::now();
    try {
      grads = multi_head_attention_backward(x.view(), loaded.weights, options, grad_out.view(),
                                            state, backward_step);
    } catch (const dist::AgreedError&) {
      throw;
    } catch (const std::exception& e) {
      problem = e.what();
    }
    backward_seconds = std::chrono::steady_clock::now() - begin;
    // As for the forward: a rank that failed before the ring stands in for its first agreement.
    if (!stepped) {
      dist::agree(comm, problem.empty() ? "the layer's backward: no attention step" : problem);
    }
    dist::agree(comm, problem);
  }

  const Tensor out = dist::gather_rows(result.out.view(), -2, n, layout, comm);
  const Tensor lse =
      result.lse.empty() ? Tensor() : dist::gather_rows(result.lse.view(), -1, n, layout, comm);
  // Only what the flags ask for travels; the same on every rank.
  LayerGradients whole;
  const auto summed = [&](const std::string& path, const Tensor& part) {
    return path.empty() || part.empty() ? Tensor() : dist::sum_over_ranks(part.view(), comm);
  };
  if (!wanted.x.empty()) whole.dx = dist::gather_rows(grads.dx.view(), -2, n, layout, comm);
  whole.dwq = summed(wanted.wq, grads.dwq);
  whole.dwk = summed(wanted.wk, grads.dwk);
  whole.dwv = summed(wanted.wv, grads.dwv);
  whole.dwo = summed(wanted.wo, grads.dwo);
  whole.dbq = summed(wanted.bq, grads.dbq);
  whole.dbk = summed(wanted.bk, grads.dbk);
  whole.dbv = summed(wanted.bv, grads.dbv);
  whole.dbo = summed(wanted.bo, grads.dbo);
  if (me == 0) {
    try {
      std::vector<OutputFile> outputs = {{command.out_path, out.view(), "--out"}};
      add_extra_outputs(command.flags, Tensor(), lse, outputs);
      std::vector<Tensor> transposed;
      add_gradients(command, whole, transposed, outputs);
      write_outputs(outputs, out_dtype);
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  dist::agree(comm, problem);
  if (command.report.verbose) {
    const std::int64_t rows = x.shape().empty() ? 0 : x.shape()[x.shape().size() - 2];
    print_ring_times("qkv layer --ring", ring.times, ring.kernel, ring.threads, me, ranks, rows,
                     seconds.count());
    if (gradients) {
      print_ring_times("qkv layer --ring backward", ring_grads.times, ring_grads.kernel,
                       ring_grads.threads, me, ranks, rows, backward_seconds.count());
    }
  }
}

}  // namespace qkv::cli
