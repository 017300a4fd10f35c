// qkv layer: the whole multi-head layer, from X and the projection matrices (layer_weights.h reads
// them, for qkv explain too).
#include "command_layer.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>

#include "cli_common.h"
#include "command_ring.h"
#include "commands.h"
#include "core/format_bytes.h"
#include "layer_weights.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/layer.h"
#include "qkv/layer_backward.h"
#include "run_report.h"

namespace qkv::cli {

void add_gradients(const LayerCommand& command, const LayerGradients& g,
                   std::vector<Tensor>& transposed, std::vector<OutputFile>& outputs) {
  const LayerGradientFlags& f = command.gradients;
  const auto add = [&](const std::string& path, const Tensor& grad, bool matrix,
                       const char* flag) {
    if (path.empty()) return;
    if (matrix && command.weights.linear_layout) {
      const TensorView view = grad.view();
      const TensorView t{view.data,
                         view.dtype,
                         {view.shape[1], view.shape[0]},
                         {view.strides[1], view.strides[0]},
                         view.name};
      transposed.push_back(contiguous_copy(t, grad.dtype()));
      outputs.push_back({path, transposed.back().view(), flag});
    } else {
      outputs.push_back({path, grad.view(), flag});
    }
  };
  transposed.reserve(4);  // the views above must not move
  add(f.x, g.dx, false, "--grad-x");
  add(f.memory, g.dmemory, false, "--grad-memory");
  add(f.wq, g.dwq, true, "--grad-wq");
  add(f.wk, g.dwk, true, "--grad-wk");
  add(f.wv, g.dwv, true, "--grad-wv");
  add(f.wo, g.dwo, true, "--grad-wo");
  add(f.bq, g.dbq, false, "--grad-bq");
  add(f.bk, g.dbk, false, "--grad-bk");
  add(f.bv, g.dbv, false, "--grad-bv");
  add(f.bo, g.dbo, false, "--grad-bo");
}

void check_gradient_flags(const LayerCommand& command) {
  const LayerGradientFlags& f = command.gradients;
  if (!f.grad_out.empty() && !f.wanted()) {
    throw CLI::ValidationError("--grad-out",
                               "needs one of --grad-x, --grad-memory, --grad-wq, "
                               "--grad-wk, --grad-wv, --grad-wo or a --grad-b*");
  }
  const bool fused = !command.weights.wqkv.empty() || !command.weights.bqkv.empty();
  for (const auto& [path, flag] : {std::pair{&f.wq, "--grad-wq"},
                                   {&f.wk, "--grad-wk"},
                                   {&f.wv, "--grad-wv"},
                                   {&f.bq, "--grad-bq"},
                                   {&f.bk, "--grad-bk"},
                                   {&f.bv, "--grad-bv"}}) {
    if (fused && !path->empty()) {
      throw CLI::ValidationError(flag,
                                 "needs the separate weights (--wq, --wk, --wv and their "
                                 "biases), not --wqkv/--bqkv");
    }
  }
}

namespace {

// The useful flops of the layer: the projections (2 per multiply-add of each X·W or M·W and of
// the output projection) and attention over its heads.
double layer_flops(const Shape& x, const Shape& memory, const LayerWeights& w,
                   const LayerOptions& options) {
  if (x.size() < 2 || w.wq.rank() != 2 || w.wk.rank() != 2 || w.wv.rank() != 2) return 0;
  const std::int64_t h = options.heads;
  const std::int64_t hkv = options.kv_heads == 0 ? h : options.kv_heads;
  if (h <= 0 || hkv <= 0) return 0;
  const Shape& m = memory.empty() ? x : memory;
  double x_rows = 1, m_rows = 1;
  for (std::size_t i = 0; i + 1 < x.size(); ++i) x_rows *= static_cast<double>(x[i]);
  for (std::size_t i = 0; i + 1 < m.size(); ++i) m_rows *= static_cast<double>(m[i]);
  const auto product = [](double rows, const TensorView& weight) {
    return 2.0 * rows * static_cast<double>(weight.dim(0)) * static_cast<double>(weight.dim(1));
  };
  double flops = product(x_rows, w.wq) + product(m_rows, w.wk) + product(m_rows, w.wv);
  if (w.wo && w.wo->rank() == 2) flops += product(x_rows, *w.wo);
  const std::int64_t b = x.size() == 3 ? x[0] : 1;
  const std::int64_t dk = w.wq.dim(1) / h, dv = w.wv.dim(1) / hkv;
  return flops + attention_flops({b, h, x[x.size() - 2], dk}, {b, hkv, m[m.size() - 2], dk},
                                 {b, hkv, m[m.size() - 2], dv}, options.attention);
}

// With a budget and --grad-out, the whole call is checked before the forward runs: the forward,
// what it leaves held for the backward and the backward's own allocations
// (multi_head_attention_backward_memory), against what the inputs leave of the budget, so that a
// budget too small for the gradients is refused before any computing, as qkv attention does.
void check_gradient_budget(const Tensor& x, const LayerWeights& weights,
                           const LayerOptions& options, const std::optional<Tensor>& memory) {
  const std::uint64_t budget = options.attention.max_memory;
  if (budget == 0) return;
  const std::uint64_t need = within_memory_budget("the layer's backward", [&] {
    return multi_head_attention_backward_memory(x.view(), weights, options, view_of(memory));
  });
  if (need > budget) {
    throw Error("--max-memory", "the layer's forward and backward need " +
                                    core::format_bytes_exact(need) +
                                    "; the budget left after the inputs is " +
                                    core::format_bytes_exact(budget) +
                                    " (checked before the forward)");
  }
}

void run_layer(const LayerCommand& command) {
  if (command.ring) {
    run_on_ranks("qkv layer", layer_ring_refusals(command),
                 [&](const dist::Communicator& comm, int ranks, int me) {
                   run_layer_ring(command, comm, ranks, me);
                 });
    return;
  }
  check_gradient_flags(command);
  std::vector<std::string> specs = weight_specs(command.weights);
  specs.push_back(command.gradients.grad_out);
  specs.push_back(command.x_path);
  specs.push_back(command.memory_path);
  check_weight_flags(command.weights);
  const std::uint64_t input_bytes = check_input_sizes(command.flags, specs);
  const std::optional<Tensor> x = read_optional(command.x_path);
  LoadedWeights loaded;
  load_weights(command.weights, loaded);
  const std::optional<Tensor> memory = read_optional(command.memory_path);
  const AttentionTensors tensors = load_attention_tensors(command.flags);
  if (tensors.cu_seqlens_q && x->shape().size() != 2) {
    throw Error(command.x_path,
                "a packed batch (--cu-seqlens-q, --cu-seqlens-k) takes X as [total, d], the "
                "sequences' rows one after another, got " +
                    shape_string(x->shape()));
  }

  const LayerWeights& weights = loaded.weights;

  LayerOptions options;
  options.heads = command.weights.heads;
  options.kv_heads = command.weights.kv_heads;
  options.attention = attention_options(command.flags, tensors);
  // float16 outputs are computed in float32 and rounded once as they are written, as attention()
  // does (the layer itself computes and returns float32 or float64).
  const DType out_dtype = options.attention.out_dtype;
  if (out_dtype == DType::kF16) options.attention.out_dtype = DType::kF32;
  apply_memory_budget(command.flags, input_bytes, options.attention);
  const bool gradients = command.gradients.wanted();
  if (gradients) check_gradient_budget(*x, weights, options, memory);
  ProgressLine progress(!command.report.quiet, "qkv layer");
  options.attention.progress = progress.callback();
  const auto start = std::chrono::steady_clock::now();
  LayerForwardState state;
  const LayerResult result = within_memory_budget("the layer", [&] {
    return gradients ? multi_head_attention(x->view(), weights, options, view_of(memory), state)
                     : multi_head_attention(x->view(), weights, options, view_of(memory));
  });
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  progress.erase();

  std::vector<OutputFile> outputs = {{command.out_path, result.out.view(), "--out"}};
  add_extra_outputs(command.flags, result.weights, result.lse, outputs);
  LayerGradients grads;
  std::vector<Tensor> transposed;
  if (gradients) {
    const Tensor grad_out = read_input(command.gradients.grad_out);
    ProgressLine backward_progress(!command.report.quiet, "qkv layer, backward", "key row");
    options.attention.progress = backward_progress.callback();
    grads = within_memory_budget("the layer's backward", [&] {
      return multi_head_attention_backward(x->view(), weights, options, grad_out.view(),
                                           view_of(memory), &state);
    });
    backward_progress.erase();
    options.attention.progress = nullptr;
    add_gradients(command, grads, transposed, outputs);
  }
  write_outputs(outputs, out_dtype);
  if (command.report.verbose) {
    std::string shapes = tensor_summary("X", x->shape(), x->dtype());
    if (memory) shapes += ", " + tensor_summary("M", memory->shape(), memory->dtype());
    shapes += ", " + std::to_string(options.heads) + " heads -> " +
              tensor_summary("out", result.out.shape(), result.out.dtype());
    const std::string line = summary_line(RunSummary{
        .command = "qkv layer",
        .shapes = shapes,
        .kernel = result.kernel,
        .compute = std::nullopt,  // the layer does not say which storage type it computed in
        .threads = options.attention.threads,
        .seconds = seconds.count(),
        .flops = layer_flops(x->shape(), memory ? memory->shape() : Shape{}, weights, options)});
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

}  // namespace

void register_layer_command(CLI::App& app) {
  auto command = std::make_shared<LayerCommand>();
  CLI::App* sub = app.add_subcommand(
      "layer", "multi-head attention from X and W^Q, W^K, W^V (+ W^O, biases, memory)");
  sub->add_option("--x", command->x_path,
                  "samples, one per row: [B,N,d] or [N,d] ([total,d] with --cu-seqlens-*)")
      ->required();
  add_weight_flags(*sub, command->weights, /*heads_required=*/true);
  sub->add_option("--memory", command->memory_path,
                  "cross-attention: K and V from M [B,Nm,d_m] instead of X");
  as_output(sub->add_option("--out", command->out_path,
                            "output [.., N, d_out] ([.., N, H·dv] without --wo)"))
      ->required();
  add_attention_flags(
      *sub, command->flags,
      FlagGroups{
          .precision = true, .score_modifiers = true, .packed_batches = true, .dropout = true});
  LayerGradientFlags& g = command->gradients;
  CLI::Option* grad_out = sub->add_option(
      "--grad-out", g.grad_out,
      "dY, the output's gradient: compute the gradients of sum(out * dY) the --grad-* flags ask "
      "for");
  const auto gradient = [&](const char* flag, std::string& path, const char* what,
                            const char* needs = nullptr) {
    CLI::Option* option = as_output(sub->add_option(flag, path, what))->needs(grad_out);
    if (needs != nullptr) option->needs(sub->get_option(needs));
  };
  gradient("--grad-x", g.x, "dX output, X's shape");
  gradient("--grad-memory", g.memory, "dM output, the memory's shape", "--memory");
  gradient("--grad-wq", g.wq, "dW^Q output, W^Q's shape (and layout)");
  gradient("--grad-wk", g.wk, "dW^K output");
  gradient("--grad-wv", g.wv, "dW^V output");
  gradient("--grad-wo", g.wo, "dW^O output", "--wo");
  gradient("--grad-bq", g.bq, "db^Q output", "--bq");
  gradient("--grad-bk", g.bk, "db^K output", "--bk");
  gradient("--grad-bv", g.bv, "db^V output", "--bv");
  gradient("--grad-bo", g.bo, "db^O output", "--bo");
  sub->add_flag("--ring", command->ring,
                "attention across the processes of mpirun -np P: each rank projects its rows of "
                "X, the attention is ring attention over MPI, rank 0 writes --out and --lse; "
                "with --grad-out each rank reads its rows of DY, the backward runs over the "
                "ring too and rank 0 writes the --grad-* outputs (dX gathered, the weight "
                "gradients summed in rank order); --max-memory is per rank; not with --memory, "
                "--weights, --cu-seqlens-*, --dropout");
  add_report_flags(*sub, command->report);
  sub->footer(
      "Example:\n"
      "  qkv layer --x x.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy --heads 4 \\\n"
      "            --causal --out o.npy --weights w.npy\n"
      "  qkv layer --x h.npy --wqkv gpt2.safetensors:h.0.attn.c_attn.weight \\\n"
      "            --bqkv gpt2.safetensors:h.0.attn.c_attn.bias --heads 12 --causal --out o.npy\n"
      "Any tensor may be FILE.safetensors:NAME or FILE.npz:NAME (array NAME of np.savez or\n"
      "np.savez_compressed); outputs by extension: .npy, .npz or .safetensors, as for\n"
      "qkv attention. A PyTorch nn.Linear weight is the transpose of W here: say\n"
      "--linear-layout. --weights is [B,H,Nq,Nk]. --dtype rounds the projected\n"
      "Q, K, V. Packed batches: X is [total, d] (M [total_m, d_m]); --cu-seqlens-q cuts X's\n"
      "rows, --cu-seqlens-k those of X (or M) that give K and V; --lse is [H, total].\n"
      "Gradients: --grad-out DY.npy with --grad-x, --grad-wq, ... (float32, float64 for\n"
      "float64 inputs; written in --out-dtype with the other outputs, all or none). On a\n"
      "terminal the backward draws its own progress line, in key rows.\n"
      "Dropout (--dropout P --seed S [--dropout-offset O]): the heads' attention weights\n"
      "dropped with probability P, the kept ones scaled by 1/(1-P); head h of batch b draws\n"
      "the mask qkv attention draws for (b, h) on the projected Q, K, V with the same seed and\n"
      "offset, and the backward (--grad-out) draws it again. --weights then holds the weights\n"
      "after dropout; --lse is the softmax's, before dropout.\n"
      "Across processes: mpirun -np P qkv layer --ring ... splits X's rows over P ranks as\n"
      "qkv attention --ring splits Q's (see 'qkv attention --help').");
  sub->callback([command] { run_layer(*command); });
}

}  // namespace qkv::cli
