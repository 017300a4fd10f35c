// qkv attention: the core operation on given Q, K, V files.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli_common.h"
#include "core/format_bytes.h"
#include "core/memory_budget.h"
#include "command_ring.h"
#include "commands.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/io.h"
#include "run_report.h"

namespace qkv::cli {
namespace {

// The gradient flags: dO and where each gradient goes (docs/interface.md, "Gradients").
struct GradientFlags {
  std::string grad_out, grad_q, grad_k, grad_v, grad_sinks;
  std::string backward_kernel;
  bool wanted() const {
    return !grad_q.empty() || !grad_k.empty() || !grad_v.empty() || !grad_sinks.empty();
  }
};

struct AttentionCommand {
  std::string q_path, k_path, v_path, out_path;
  std::string layout;
  bool check = false;
  bool ring = false;
  AttentionFlags flags;
  GradientFlags gradients;
  ReportFlags report;
};

bool verbose_choice() {
  const char* verbose = std::getenv("QKV_VERBOSE");
  return verbose != nullptr && verbose[0] == '1';
}

// The gradients of Σ out∘dO the flags ask for, added to `outputs` (written with the others, all
// or none). `gradients` holds them until then.
void add_gradients(const AttentionCommand& command, const TensorView& q, const TensorView& k,
                   const TensorView& v, HeadLayout layout, const AttentionResult& forward,
                   AttentionOptions options, AttentionGradients& gradients,
                   std::vector<OutputFile>& outputs) {
  const GradientFlags& flags = command.gradients;
  const Tensor grad_out_read = read_input(flags.grad_out);
  const TensorView grad_out = in_layout(grad_out_read.view(), layout);
  options.kernel = flags.backward_kernel;
  // Every output is written in --out-dtype: a bf16 backward hands over its float32 sums, so
  // that they are rounded once, to --out-dtype.
  if (forward.compute == DType::kBF16) options.grad_dtype = DType::kF32;
  // What the forward allocated is no longer the backward's to spend. dO is not counted here:
  // it is an input, which the budget left after the inputs already excludes.
  if (options.max_memory > 0) {
    const std::uint64_t held =
        forward.out.nbytes() + forward.lse.nbytes() + forward.weights.nbytes();
    if (held >= options.max_memory) {
      throw Error("--max-memory",
                  "the gradients need more than the budget left after the "
                  "forward (" +
                      std::to_string(held) + " bytes held)");
    }
    options.max_memory -= held;
  }
  const auto backward = [&] {
    return attention_backward(q, k, v, forward.out.view(), forward.lse.view(), grad_out, options);
  };
  if (verbose_choice() && flags.backward_kernel.empty()) {
    const std::string choice = within_memory_budget("attention backward", [&] {
      return explain_backward_kernel_choice(q, k, v, forward.out.view(), forward.lse.view(),
                                            grad_out, options);
    });
    // "backward fused_hwy: chosen", one line per backward kernel.
    std::string lines;
    for (std::size_t at = 0; at < choice.size();) {
      const std::size_t end = choice.find('\n', at);
      lines += "backward " + choice.substr(at, end == std::string::npos ? end : end + 1 - at);
      at = end == std::string::npos ? choice.size() : end + 1;
    }
    std::fputs(lines.c_str(), stderr);
  }
  // The backward's own line: it counts key rows (the kernels' tasks own dK and dV rows).
  ProgressLine progress(!command.report.quiet, "qkv attention, backward", "key row");
  options.progress = progress.callback();
  try {
    gradients = within_memory_budget("attention backward", backward);
    progress.erase();
  } catch (const Error& e) {
    // options.kernel is --backward-kernel here, not --kernel.
    if (e.subject().rfind("kernel", 0) == 0) throw Error("--backward-kernel", e.problem());
    throw;
  }
  const auto add = [&](const std::string& path, const Tensor& grad, const char* flag) {
    if (!path.empty()) outputs.push_back({path, in_layout(grad.view(), layout), flag});
  };
  add(flags.grad_q, gradients.dq, "--grad-q");
  add(flags.grad_k, gradients.dk, "--grad-k");
  add(flags.grad_v, gradients.dv, "--grad-v");
  if (!flags.grad_sinks.empty()) {
    outputs.push_back({flags.grad_sinks, gradients.dsinks.view(), "--grad-sinks"});
  }
}

// With a budget, the backward's needs are checked before the forward runs: the forward's
// outputs, which the backward reads, and the backward's gradients and workspace
// (attention_backward_memory) must fit in what the inputs leave of it together, so that a
// budget too small for the gradients is refused before any computing, not after the forward.
void check_gradient_budget(const TensorView& q, const TensorView& k, const TensorView& v,
                           const AttentionOptions& options) {
  if (options.max_memory == 0 || q.shape.empty() || k.shape.size() < 2) return;
  const bool f64 = q.dtype == DType::kF64 || k.dtype == DType::kF64 ||
                   v.dtype == DType::kF64;
  const std::uint64_t element = f64 ? 8 : 4;
  const auto u = [](std::int64_t x) {
    return static_cast<std::uint64_t>(std::max<std::int64_t>(x, 0));
  };
  std::uint64_t rows = 1;
  for (std::size_t axis = 0; axis + 1 < q.shape.size(); ++axis)
    rows = core::saturating_mul(rows, u(q.shape[axis]));
  std::uint64_t per_row = core::saturating_add(u(v.shape.back()), 1);  // out and lse
  if (options.return_weights)
    per_row = core::saturating_add(per_row, u(k.shape[k.shape.size() - 2]));
  const std::uint64_t held = core::saturating_mul(core::saturating_mul(rows, per_row), element);
  AttentionOptions backward = options;
  backward.progress = nullptr;
  const std::uint64_t gradients = within_memory_budget("attention backward", [&] {
    return attention_backward_memory(q, k, v, backward);
  });
  const std::uint64_t total = core::saturating_add(held, gradients);
  if (total > options.max_memory) {
    throw Error("--max-memory",
                "the gradients need " + core::format_bytes_exact(total) +
                    ": the forward's outputs " + core::format_bytes(held) +
                    ", which the backward reads, and the backward's gradients and workspace " +
                    core::format_bytes(gradients) + "; the budget left after the inputs is " +
                    core::format_bytes_exact(options.max_memory) + " (checked before the forward)");
  }
}

void print_errors(const char* what, const ErrorStats& e) {
  std::printf("  %-7s max abs error %.3e  max rel error %.3e  (max |reference| %.3e)\n", what,
              e.max_abs_error, e.max_rel_error, e.max_abs_reference);
}

// The accuracy report of --check: the chosen kernel against the float64 reference.
void print_accuracy(const AccuracyReport& report) {
  std::printf("check: kernel %s against the float64 reference on the same inputs\n",
              report.kernel.c_str());
  print_errors("out", report.out);
  if (report.weights) print_errors("weights", *report.weights);
  if (report.lse) print_errors("lse", *report.lse);
}

// The flags --ring refuses, as the user spelled them: "--weights, --grad-out".
std::string ring_refusals(const AttentionCommand& c) {
  std::string refused;
  const auto refuse = [&](bool given, const char* flag) {
    if (given) refused += (refused.empty() ? "" : ", ") + std::string(flag);
  };
  const AttentionFlags& f = c.flags;
  refuse(!f.weights_path.empty(), "--weights");
  refuse(!f.cu_seqlens_q_path.empty(), "--cu-seqlens-q");
  refuse(!f.cu_seqlens_k_path.empty(), "--cu-seqlens-k");
  refuse(c.check, "--check");
  refuse(!c.layout.empty(), "--layout");
  // The ring's ranks would each draw their own blocks' masks: not drawn there.
  refuse(f.dropout != 0.0, "--dropout");
  return refused;
}

void run_attention(const AttentionCommand& command) {
  if (!command.gradients.grad_out.empty() && !command.gradients.wanted()) {
    throw CLI::ValidationError("--grad-out",
                               "needs one of --grad-q, --grad-k, --grad-v or --grad-sinks");
  }
  if (command.ring) {
    const GradientFlags& g = command.gradients;
    run_ring_attention(RingCommand{command.q_path, command.k_path, command.v_path, command.out_path,
                                   &command.flags, command.report.verbose,
                                   RingGradientPaths{g.grad_out, g.grad_q, g.grad_k, g.grad_v,
                                                     g.grad_sinks, g.backward_kernel}},
                       ring_refusals(command));
    return;
  }
  const std::uint64_t input_bytes = check_input_sizes(
      command.flags, {command.q_path, command.k_path, command.v_path, command.gradients.grad_out});
  const Tensor q_read = read_input(command.q_path);
  const Tensor k_read = read_input(command.k_path);
  const Tensor v_read = read_input(command.v_path);
  const HeadLayout layout =
      resolve_layout(command.layout, q_read.shape(), k_read.shape(), v_read.shape(),
                     !command.flags.cu_seqlens_q_path.empty());
  // What the library reads: [.., H, N, D] views of the files as they are.
  const TensorView q = in_layout(q_read.view(), layout);
  const TensorView k = in_layout(k_read.view(), layout);
  const TensorView v = in_layout(v_read.view(), layout);
  const AttentionTensors tensors = load_attention_tensors(command.flags);
  AttentionOptions options = attention_options(command.flags, tensors);
  apply_memory_budget(command.flags, input_bytes, options);
  const bool gradients_wanted = command.gradients.wanted();
  if (gradients_wanted) {
    options.return_lse = true;  // the backward reads it
    check_gradient_budget(q, k, v, options);
  }
  if (verbose_choice()) {
    const std::string choice = within_memory_budget(
        "attention", [&] { return explain_kernel_choice(q, k, v, options); });
    std::fputs(choice.c_str(), stderr);
  }
  ProgressLine progress(!command.report.quiet, "qkv attention");
  options.progress = progress.callback();
  const auto start = std::chrono::steady_clock::now();
  const AttentionResult result = within_memory_budget(
      "attention", [&] { return attention(q, k, v, options); });
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  progress.erase();
  options.progress = nullptr;
  if (command.check) {
    print_accuracy(within_memory_budget("attention --check", [&] {
      return compare_with_reference(q, k, v, options, result);
    }));
  }

  std::vector<OutputFile> outputs = {
      {command.out_path, in_layout(result.out.view(), layout), "--out"}};
  add_extra_outputs(command.flags, result.weights, result.lse, outputs);
  AttentionGradients gradients;
  if (gradients_wanted) {
    add_gradients(command, q, k, v, layout, result, options, gradients, outputs);
  }
  write_outputs(outputs, options.out_dtype);
  if (command.report.verbose) {
    const std::string line = summary_line(
        RunSummary{.command = "qkv attention",
                   .shapes = tensor_summary("Q", q_read.shape(), q_read.dtype()) + ", " +
                             tensor_summary("K", k_read.shape(), k_read.dtype()) + ", " +
                             tensor_summary("V", v_read.shape(), v_read.dtype()) + " -> " +
                             tensor_summary("out", result.out.shape(), result.out.dtype()),
                   .kernel = result.kernel,
                   .compute = result.compute,
                   .threads = result.threads,
                   .seconds = seconds.count(),
                   .flops = attention_flops(q.shape, k.shape, v.shape, options)});
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

}  // namespace

void register_attention_command(CLI::App& app) {
  auto command = std::make_shared<AttentionCommand>();
  CLI::App* sub = app.add_subcommand(
      "attention",
      "softmax(scale·Q·K^T + mask)·V on given Q, K, V (.npy, FILE.safetensors:NAME or "
      "FILE.npz:NAME)");
  sub->add_option("--q", command->q_path,
                  "queries [B,H,Nq,D], [H,Nq,D] or [Nq,D] ([H,total_q,D] or [total_q,D] packed)")
      ->required();
  sub->add_option("--k", command->k_path, "keys [.., Hkv, Nk, D]; H % Hkv == 0")->required();
  sub->add_option("--v", command->v_path, "values [.., Hkv, Nk, Dv]")->required();
  as_output(sub->add_option("--out", command->out_path, "output [.., Nq, Dv]"))->required();
  add_layout_option(*sub, command->layout);
  add_attention_flags(
      *sub, command->flags,
      FlagGroups{
          .precision = true, .score_modifiers = true, .packed_batches = true, .dropout = true});
  sub->add_flag("--check", command->check,
                "also run the float64 reference and print the chosen kernel's max errors");
  GradientFlags& g = command->gradients;
  CLI::Option* grad_out =
      sub->add_option("--grad-out", g.grad_out,
                      "dO, the output's gradient [.., Nq, Dv]: compute the gradients of "
                      "sum(out * dO) that the --grad-* flags ask for");
  const auto gradient = [&](const char* flag, std::string& path, const char* what) {
    return as_output(sub->add_option(flag, path, what))->needs(grad_out);
  };
  gradient("--grad-q", g.grad_q, "dQ output, Q's shape");
  gradient("--grad-k", g.grad_k, "dK output, K's shape (summed over the query heads of a kv head)");
  gradient("--grad-v", g.grad_v, "dV output, V's shape");
  gradient("--grad-sinks", g.grad_sinks, "dSinks output [H] (needs --sinks)")
      ->needs(sub->get_option("--sinks"));
  sub->add_option("--backward-kernel", g.backward_kernel,
                  "force a backward kernel: fused_hwy, unfused_blas, fused_scalar or reference "
                  "(default: the fastest that supports the call)")
      ->needs(grad_out);
  sub->add_flag("--ring", command->ring,
                "attention across the processes of mpirun -np P (ring attention over MPI): rank "
                "0 writes --out, --lse and the --grad-* gradients; not with --weights, "
                "--cu-seqlens-*, --check, --dropout");
  add_report_flags(*sub, command->report);
  sub->footer(
      "Example:\n"
      "  qkv attention --q q.npy --k k.npy --v v.npy --causal --out o.npy --weights w.npy\n"
      "  qkv attention --q q.npy --k k.npy --v v.npy --dtype bf16 --softcap 30 --sinks s.npy \\\n"
      "                --cu-seqlens-q cq.npy --cu-seqlens-k ck.npy --causal --out o.npy\n"
      "The softmax sees softcap(scale·q·k) + alibi + float mask. Query head h uses kv head\n"
      "h / (H/Hkv). A row with no allowed key gives zeros and lse = -inf (--sinks: the sink).\n"
      "Packed: causal, window and ALiBi positions count within each sequence.\n"
      ".npy inputs are float32, float64 or float16 (kept as stored), masks also bool.\n"
      "Any tensor may be FILE.safetensors:NAME (F32, F64, F16, BF16 or BOOL) or FILE.npz:NAME\n"
      "(array NAME of np.savez or np.savez_compressed, read as its NAME.npy), but the\n"
      "--cu-seqlens-* offsets: int32 or int64 .npy (the only integer files read).\n"
      "3-D Q, K, V are [H, N, D]; --layout bnhd reads [N, H, D] (4-D: [B, N, H, D]). A 3-D Q\n"
      "that K and V let be read either way is refused unless --layout says which (or Q\n"
      "and K have equal row counts read heads first).\n"
      "Each output's extension picks its format: .npy (or none), .npz (np.load(path)['out'],\n"
      "an array named after its flag) or .safetensors; outputs naming the same .npz or\n"
      ".safetensors file share it (--out r.npz --lse r.npz). Another extension is refused.\n"
      "Outputs are always written as .npy (no .npz).\n"
      "Dropout (--dropout P --seed S): weights dropped with probability P, the kept ones\n"
      "scaled by 1/(1-P); the mask depends on the seed, --dropout-offset and each weight's\n"
      "(batch, head, row, key) only, and the gradients draw it again. --weights then holds\n"
      "the weights after dropout; --lse is the softmax's, before dropout.\n"
      "Gradients (--grad-out with --grad-q/k/v/sinks) are computed in the forward's type:\n"
      "float32, float64 for float64 inputs, bf16 with --dtype bf16 or bf16 inputs (bf16 dot\n"
      "products, P and dS rounded to bf16 as operands, float32 sums and softmax); they are\n"
      "written in --out-dtype. An f16 --dtype is refused with them, and so is bf16 with --ring.\n"
      "On a terminal the backward draws its own progress line, in key rows.\n"
      "Across processes: mpirun -np P qkv attention --ring --q q.npy --k k.npy --v v.npy\n"
      "--causal --out o.npy splits the sequence over P ranks (zig-zag under --causal or\n"
      "--window, else contiguous blocks) and passes K/V around a ring; -v prints each rank's\n"
      "compute, wait and transfer times. Without mpirun it runs as one rank. With --grad-out the\n"
      "gradients go round the ring too (dK/dV travel with their K/V block back to its owner);\n"
      "--backward-kernel there: fused_hwy, unfused_blas or fused_scalar. A rank gives up after\n"
      "QKV_RING_TIMEOUT seconds (default 300) waiting on another, and aborts the job.\n"
      "QKV_VERBOSE=1 prints which kernel ran and why the others declined or were passed over, "
      "and whether the system refused threads (stderr). Every dimension may be 0.");
  sub->callback([command] { run_attention(*command); });
}

}  // namespace qkv::cli
