// What every rank of a --ring job must share before it computes (command_ring.h). Each rank
// parses its own command line and reads its own files, which may be node-local copies: ranks
// started with different flags or files of different shapes would otherwise run different
// collectives (an MPI error), or the same ones over different problems (a wrong answer with
// status 0). The settings name the flags as the user spelled them, so that the one line rank 0
// prints says which ("rank 1: --causal differs from rank 0's: on here, off on rank 0"; "rank 1:
// --k differs from rank 0's: [2, 17, 8] f32 here, [2, 16, 8] f32 on rank 0").
#include <charconv>
#include <string>
#include <system_error>
#include <vector>

#include "command_layer.h"
#include "command_ring.h"

namespace qkv::cli {
namespace {

std::string on_off(bool on) { return on ? "on" : "off"; }

std::string given(const std::string& path) { return path.empty() ? "not given" : "given"; }

// The flag's value as the library will read it: the shortest decimal that reads back as it.
std::string number(double x) {
  char text[32];
  const auto [end, error] = std::to_chars(text, text + sizeof text, x);
  return error == std::errc() ? std::string(text, end) : "?";
}

// An input file's shape and dtype from its header (whole: every rank's file must be the same
// tensor), or "not given". A file that cannot be inspected throws; the caller's agreement on
// errors reports it.
dist::Setting file_setting(const std::string& flag, const std::string& spec) {
  if (spec.empty()) return {flag, "not given"};
  const TensorInfo info = inspect_input(spec);
  return {flag, shape_string(info.shape) + " " + dtype_name(info.dtype)};
}

void add_attention_flags(const AttentionFlags& f, std::vector<dist::Setting>& settings) {
  const bool scale = f.scale_option != nullptr && f.scale_option->count() > 0;
  const bool softcap = f.softcap_option != nullptr && f.softcap_option->count() > 0;
  settings.push_back(file_setting("--mask", f.mask_path));
  settings.push_back({"--causal", on_off(f.causal)});
  settings.push_back({"--window", f.window.empty() ? "not given" : f.window});
  settings.push_back({"--scale", scale ? number(f.scale) : "not given"});
  settings.push_back({"--weights", given(f.weights_path)});
  settings.push_back({"--lse", given(f.lse_path)});
  settings.push_back({"--out-dtype", f.out_dtype});
  settings.push_back({"--kernel", f.kernel.empty() ? "not given" : f.kernel});
  settings.push_back({"--dtype", f.dtype.empty() ? "not given" : f.dtype});
  settings.push_back({"--softcap", softcap ? number(f.softcap) : "not given"});
  settings.push_back({"--alibi", on_off(f.alibi)});
  // The values of the slopes and sinks are compared by the ring itself (dist::ring_settings).
  settings.push_back(file_setting("--alibi-slopes", f.alibi_slopes_path));
  settings.push_back(file_setting("--sinks", f.sinks_path));
  settings.push_back({"--cu-seqlens-q", given(f.cu_seqlens_q_path)});
  settings.push_back({"--cu-seqlens-k", given(f.cu_seqlens_k_path)});
}

}  // namespace

std::vector<dist::Setting> attention_ring_settings(const RingCommand& command) {
  const RingGradientPaths& g = command.gradients;
  std::vector<dist::Setting> settings = {
      file_setting("--q", command.q_path),
      file_setting("--k", command.k_path),
      file_setting("--v", command.v_path),
      file_setting("--grad-out", g.grad_out),
      {"--grad-q", given(g.grad_q)},
      {"--grad-k", given(g.grad_k)},
      {"--grad-v", given(g.grad_v)},
      {"--grad-sinks", given(g.grad_sinks)},
      {"--backward-kernel", g.backward_kernel.empty() ? "not given" : g.backward_kernel},
  };
  add_attention_flags(*command.flags, settings);
  return settings;
}

std::vector<dist::Setting> layer_ring_settings(const LayerCommand& command) {
  const WeightFlags& w = command.weights;
  const LayerGradientFlags& g = command.gradients;
  std::vector<dist::Setting> settings = {
      file_setting("--x", command.x_path),
      file_setting("--memory", command.memory_path),
      file_setting("--wq", w.wq),
      file_setting("--wk", w.wk),
      file_setting("--wv", w.wv),
      file_setting("--wqkv", w.wqkv),
      file_setting("--wo", w.wo),
      file_setting("--bq", w.bq),
      file_setting("--bk", w.bk),
      file_setting("--bv", w.bv),
      file_setting("--bqkv", w.bqkv),
      file_setting("--bo", w.bo),
      {"--heads", std::to_string(w.heads)},
      {"--kv-heads", w.kv_heads == 0 ? "not given" : std::to_string(w.kv_heads)},
      {"--linear-layout", on_off(w.linear_layout)},
      file_setting("--grad-out", g.grad_out),
  };
  for (const auto& [flag, path] :
       {std::pair{"--grad-x", &g.x}, {"--grad-memory", &g.memory}, {"--grad-wq", &g.wq},
        {"--grad-wk", &g.wk}, {"--grad-wv", &g.wv}, {"--grad-wo", &g.wo}, {"--grad-bq", &g.bq},
        {"--grad-bk", &g.bk}, {"--grad-bv", &g.bv}, {"--grad-bo", &g.bo}}) {
    settings.push_back({flag, given(*path)});
  }
  add_attention_flags(command.flags, settings);
  return settings;
}

}  // namespace qkv::cli
