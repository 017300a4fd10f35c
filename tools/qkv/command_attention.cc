// qkv attention: the core operation on given Q, K, V files.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "qkv/attention.h"
#include "qkv/io.h"
#include "run_report.h"

namespace qkv::cli {
namespace {

struct AttentionCommand {
  std::string q_path, k_path, v_path, out_path;
  bool check = false;
  AttentionFlags flags;
  ReportFlags report;
};

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

void run_attention(const AttentionCommand& command) {
  const std::uint64_t input_bytes =
      check_input_sizes(command.flags, {command.q_path, command.k_path, command.v_path});
  const Tensor q = read_input(command.q_path);
  const Tensor k = read_input(command.k_path);
  const Tensor v = read_input(command.v_path);
  const AttentionTensors tensors = load_attention_tensors(command.flags);
  AttentionOptions options = attention_options(command.flags, tensors);
  apply_memory_budget(command.flags, input_bytes, options);
  if (const char* verbose = std::getenv("QKV_VERBOSE"); verbose != nullptr && verbose[0] == '1') {
    const std::string choice = within_memory_budget(
        "attention", [&] { return explain_kernel_choice(q.view(), k.view(), v.view(), options); });
    std::fputs(choice.c_str(), stderr);
  }
  ProgressLine progress(!command.report.quiet, "qkv attention");
  options.progress = progress.callback();
  const auto start = std::chrono::steady_clock::now();
  const AttentionResult result = within_memory_budget(
      "attention", [&] { return attention(q.view(), k.view(), v.view(), options); });
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  progress.erase();
  options.progress = nullptr;
  if (command.check) {
    print_accuracy(within_memory_budget("attention --check", [&] {
      return compare_with_reference(q.view(), k.view(), v.view(), options, result);
    }));
  }

  std::vector<OutputFile> outputs = {{command.out_path, result.out.view()}};
  add_extra_outputs(command.flags, result.weights, result.lse, outputs);
  write_outputs(outputs, options.out_dtype);
  if (command.report.verbose) {
    const std::string line = summary_line(RunSummary{
        .command = "qkv attention",
        .shapes = tensor_summary("Q", q.shape(), q.dtype()) + ", " +
                  tensor_summary("K", k.shape(), k.dtype()) + ", " +
                  tensor_summary("V", v.shape(), v.dtype()) + " -> " +
                  tensor_summary("out", result.out.shape(), result.out.dtype()),
        .kernel = result.kernel,
        .compute = result.compute,
        .threads = result.threads,
        .seconds = seconds.count(),
        .flops = attention_flops(q.shape(), k.shape(), v.shape(), options)});
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
  sub->add_option("--out", command->out_path, "output [.., Nq, Dv]")->required();
  add_attention_flags(
      *sub, command->flags,
      FlagGroups{.precision = true, .score_modifiers = true, .packed_batches = true});
  sub->add_flag("--check", command->check,
                "also run the float64 reference and print the chosen kernel's max errors");
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
      "Outputs are always written as .npy (no .npz).\n"
      "QKV_VERBOSE=1 prints which kernel ran and why the others declined or were passed over, "
      "and whether the system refused threads (stderr). Every dimension may be 0.");
  sub->callback([command] { run_attention(*command); });
}

}  // namespace qkv::cli
