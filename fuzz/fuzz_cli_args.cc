// Fuzz target: the command line. The input is split at NUL bytes into arguments for the qkv
// app with its `attention`, `layer`, `explain` and `train` commands, run in a scratch folder (on
// tmpfs where there is one) holding a few small valid inputs that the seeds name (q.npy, k.npy,
// v.npy, x.npy, w.npy, m.npy, model.safetensors, model.npz, and for the version-2 flags --dtype,
// --softcap, --alibi, --alibi-slopes, --sinks, --cu-seqlens-q/-k and --out-dtype f16: q16.npy,
// s.npy, cq.npy, ck.npy; for explain's labels, l.txt; for the gradient flags, dy.npy, dyb.npy
// (bool), do.npy and dobig.npy). explain's walk-through goes to stdout, which is /dev/null here.
// train makes its data from its flags, so under the fuzzer its sizes are held tiny
// (hold_train_small below). Whatever the arguments, parsing and running must end in success, a
// usage error (CLI::Error) or qkv::Error with a one-line message; any other exception or crash
// is a finding.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "commands.h"
#include "fuzz/fuzz_util.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "tests/io/npz_builder.h"

namespace {

constexpr std::size_t kMaxArgs = 40;
constexpr std::size_t kMaxArgBytes = 256;

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

qkv::Tensor filled(const qkv::Shape& shape, float start) {
  qkv::Tensor t(qkv::DType::kF32, shape, "t");
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    t.data_as<float>()[i] = start + 0.125f * static_cast<float>(i % 13) - 0.5f;
  }
  return t;
}

std::filesystem::path g_scratch;

void remove_scratch_folder() {
  std::error_code ignored;
  std::filesystem::remove_all(g_scratch, ignored);
}

void prepare_scratch_folder() {
  const char* shm = "/dev/shm";
  std::filesystem::path base = std::filesystem::is_directory(shm)
                                   ? std::filesystem::path(shm)
                                   : std::filesystem::temp_directory_path();
  const std::filesystem::path dir = base / ("qkv-fuzz-cli-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  g_scratch = dir;
  std::atexit(remove_scratch_folder);
  qkv::write_npy(dir / "q.npy", filled({2, 5, 4}, 0.1f).view(), qkv::DType::kF32);
  qkv::write_npy(dir / "k.npy", filled({1, 6, 4}, 0.2f).view(), qkv::DType::kF32);
  qkv::write_npy(dir / "v.npy", filled({1, 6, 3}, 0.3f).view(), qkv::DType::kF64);
  qkv::write_npy(dir / "x.npy", filled({5, 8}, 0.4f).view(), qkv::DType::kF32);
  qkv::write_npy(dir / "w.npy", filled({8, 8}, 0.5f).view(), qkv::DType::kF32);
  qkv::Tensor mask(qkv::DType::kBool, {5, 6}, "m");
  for (std::int64_t i = 0; i < mask.numel(); ++i) mask.data_as<bool>()[i] = i % 3 != 0;
  qkv::write_npy(dir / "m.npy", mask.view(), qkv::DType::kBool);
  // Gradients: dY for the layer on x.npy with w.npy's (float and bool), dO for q.npy's output
  // (ordinary, and large enough that dV passes float16's range).
  qkv::write_npy(dir / "dy.npy", filled({5, 8}, 0.7f).view(), qkv::DType::kF32);
  qkv::Tensor dy_bool(qkv::DType::kBool, {5, 8}, "dyb");
  for (std::int64_t i = 0; i < dy_bool.numel(); ++i) dy_bool.data_as<bool>()[i] = i % 2 == 0;
  qkv::write_npy(dir / "dyb.npy", dy_bool.view(), qkv::DType::kBool);
  qkv::write_npy(dir / "do.npy", filled({2, 5, 3}, 0.8f).view(), qkv::DType::kF32);
  qkv::write_npy(dir / "dobig.npy", filled({2, 5, 3}, 60000.0f).view(), qkv::DType::kF32);
  // Version 2: float16 queries, one value per query head (slopes or sinks, H = 2), and the
  // offsets of a packed batch of q.npy's 5 and k.npy's 6 rows in two sequences.
  qkv::write_npy(dir / "q16.npy", filled({2, 5, 4}, 0.1f).view(), qkv::DType::kF16);
  qkv::write_npy(dir / "s.npy", filled({2}, 0.6f).view(), qkv::DType::kF32);
  qkv::Tensor cq(qkv::DType::kI32, {3}, "cq"), ck(qkv::DType::kI64, {3}, "ck");
  const std::int32_t q_offsets[] = {0, 2, 5};
  const std::int64_t k_offsets[] = {0, 4, 6};
  std::memcpy(cq.data(), q_offsets, sizeof q_offsets);
  std::memcpy(ck.data(), k_offsets, sizeof k_offsets);
  qkv::write_npy(dir / "cq.npy", cq.view(), qkv::DType::kI32);
  qkv::write_npy(dir / "ck.npy", ck.view(), qkv::DType::kI64);
  // model.safetensors: "w" [8, 8] F32 and "c_attn" [8, 24] F32.
  const qkv::Tensor w = filled({8, 8}, 0.6f), c = filled({8, 24}, 0.7f);
  std::string header = R"({"w":{"dtype":"F32","shape":[8,8],"data_offsets":[0,256]},)"
                       R"("c_attn":{"dtype":"F32","shape":[8,24],"data_offsets":[256,1024]}})";
  while (header.size() % 8 != 0) header += ' ';
  std::string file;
  for (int i = 0; i < 8; ++i) file.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  file += header;
  file.append(static_cast<const char*>(w.data()), w.nbytes());
  file.append(static_cast<const char*>(c.data()), c.nbytes());
  write_file(dir / "model.safetensors", file);
  // model.npz, as np.savez_compressed writes it: "q" [2, 5, 4] (as q.npy), "w" [8, 8] stored.
  qkv::testing::write_npz(
      dir / "model.npz",
      {{"q.npy", qkv::encode_npy(filled({2, 5, 4}, 0.1f).view(), qkv::DType::kF32), true},
       {"w.npy", qkv::encode_npy(w.view(), qkv::DType::kF32), false}});
  write_file(dir / "l.txt", "first\nsecond\nthird\nfourth\n");
  if (::chdir(dir.c_str()) != 0) qkv::fuzz::fail("cannot enter the scratch folder");
  // libFuzzer reports on stderr; explain's text would only flood the log.
  if (std::freopen("/dev/null", "w", stdout) == nullptr) qkv::fuzz::fail("cannot silence stdout");
}

// train's sizes and steps, held tiny so that one input runs in milliseconds and allocates
// kilobytes (under -malloc_limit_mb=256 and -timeout=10, with AddressSanitizer): each flag gets
// one more range check (past it, a usage error, as past the command's own range) and a tiny
// default; one thread by default, at most two (0 would start one per hardware thread), and no
// summary line (it would flood libFuzzer's log). Every flag, value form and refusal of the
// command is still reached; only the sizes it would run are bounded.
void hold_train_small(CLI::App& app) {
  CLI::App* train = app.get_subcommand("train");
  struct Cap {
    const char* flag;
    int low, high, tiny;
  };
  const Cap caps[] = {{"--layers", 1, 2, 1},  {"--d-model", 1, 16, 8}, {"--heads", 1, 4, 1},
                      {"--pairs", 1, 4, 2},   {"--queries", 1, 4, 2},  {"--vocab", 2, 16, 4},
                      {"--seq-len", 0, 16, 0}, {"--steps", 0, 3, 2},   {"--batch", 1, 4, 2},
                      {"--heldout", 1, 8, 4}, {"--threads", 1, 2, 1}};
  for (const Cap& cap : caps) {
    train->get_option(cap.flag)
        ->check(CLI::Range(cap.low, cap.high))
        ->run_callback_for_default()
        ->default_val(cap.tiny);
  }
  train->get_option("--quiet")->run_callback_for_default()->default_val(true);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  prepare_scratch_folder();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args = {"qkv"};
  std::string current;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
      if (args.size() > kMaxArgs) return 0;
    } else if (current.size() < kMaxArgBytes) {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (!current.empty()) args.push_back(current);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());

  CLI::App app{"qkv"};
  app.require_subcommand(1);
  qkv::cli::register_attention_command(app);
  qkv::cli::register_layer_command(app);
  qkv::cli::register_explain_command(app);
  qkv::cli::register_train_command(app);
  hold_train_small(app);
  // QKV_FUZZ_VERBOSE=1 says how each input ended (to check that the seeds reach the commands).
  static const bool verbose = std::getenv("QKV_FUZZ_VERBOSE") != nullptr;
  std::string outcome = "ran";
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::Error& e) {
    // A usage error (or --help): the CLI prints it and exits 0 or 2.
    outcome = std::string("usage: ") + e.what();
  } catch (const qkv::Error& e) {
    // A message quotes file names as given (main prints it with line breaks made spaces): it
    // may hold a line break only if an argument does.
    bool args_break_lines = false;
    for (const std::string& a : args) {
      args_break_lines = args_break_lines || a.find_first_of("\n\r") != std::string::npos;
    }
    if (!args_break_lines) qkv::fuzz::check_one_line(e.what());
    outcome = std::string("error: ") + e.what();
  }
  if (verbose) std::fprintf(stderr, "  %s\n", outcome.c_str());
  return 0;
}
