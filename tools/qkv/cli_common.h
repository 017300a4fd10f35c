// What `qkv attention` and `qkv layer` share: the attention flags, loading inputs, and writing
// every output together or not at all.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/out_of_memory.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/tensor.h"

namespace qkv::cli {

// The flags of every option of `qkv attention` but the inputs and --out.
// Thrown by a command that has printed its error itself (a ring run, whose rank 0 speaks for
// every rank before any exits): main() exits with `status` and prints nothing more.
struct AlreadyReported {
  int status;
};
inline constexpr int kExitStatusBadInput = 1;

struct AttentionFlags {
  std::string mask_path;
  bool causal = false;
  std::string window;
  double scale = 0.0;
  CLI::Option* scale_option = nullptr;
  std::string weights_path;
  std::string lse_path;
  std::string out_dtype = "f32";
  int threads = 0;
  std::string kernel;
  std::string max_memory;  // empty: the default budget

  // The version 2 groups (FlagGroups); each stays empty unless its group was added.
  std::string dtype;  // empty: the library's default
  double softcap = 0.0;
  CLI::Option* softcap_option = nullptr;
  bool alibi = false;
  std::string alibi_slopes_path;
  std::string sinks_path;
  std::string cu_seqlens_q_path;
  std::string cu_seqlens_k_path;
  double dropout = 0.0;
  std::uint64_t seed = 0;
  std::uint32_t dropout_offset = 0;
};

// The flag groups a command offers beyond the version 1 set (--mask ... --max-memory), so that
// a command offers only what it honours.
struct FlagGroups {
  bool precision = false;        // --dtype, and f16 for --out-dtype
  bool score_modifiers = false;  // --softcap, --alibi, --alibi-slopes, --sinks
  bool packed_batches = false;   // --cu-seqlens-q, --cu-seqlens-k (not with --mask, --weights)
  bool dropout = false;          // --dropout, --seed, --dropout-offset
};

// --dropout P (in [0, 1)), --seed S (an integer in [0, 2^64)) and --dropout-offset O (an
// integer in [0, 2^32)) into the given variables, checked by the parser.
void add_dropout_flags(CLI::App& command, double& dropout, std::uint64_t& seed,
                       std::uint32_t* offset);
// The parser's check of a dropout rate: a number in [0, 1).
CLI::Validator dropout_rate_check();

// A CLI11 check that an integer flag is at least `minimum`:
// "--tokens: must be an integer >= 0, got '-1'".
CLI::Validator at_least(std::int64_t minimum);

// --threads, the same for every command: 0 (all cores) or more, checked by the parser
// ("--threads: must be 0 (all cores) or more, got -2").
CLI::Option* add_threads_option(CLI::App& command, int& threads, const std::string& description);

// The problem a usage error (a CLI11 error other than --help or --version) reports, without the
// command's name: an unknown option or argument is named first ("unknown option --Q"), whatever
// else the parser found missing ("--q is required"); else CLI11's own message.
// An unknown option is followed by the command's closest option, when one is close
// ("unknown option --casual; did you mean --causal?").
std::string usage_problem(const CLI::App& app, const CLI::ParseError& error);

// The candidate closest to `word` (edit distance with transpositions, at most 1 for words of up
// to 4 characters, else 2 or a quarter of its length, whichever is more), or empty when none is
// that close; the first of equals.
std::string closest_word(const std::string& word, const std::vector<std::string>& candidates);

// Adds the flags; combinations refused whatever the inputs (--alibi with --alibi-slopes, one
// --cu-seqlens-* without the other or with --mask or --weights) and bad words or numbers
// (--dtype f8, --softcap 0) are refused by the parser: one line naming the flags, nothing read.
void add_attention_flags(CLI::App& command, AttentionFlags& flags, FlagGroups groups = {});

// The tensor files the flags name, read: the --mask (see load_mask), --alibi-slopes, --sinks,
// and the --cu-seqlens-* offsets (int32 or int64 .npy, read_npy_offsets).
struct AttentionTensors {
  std::optional<Tensor> mask;
  std::optional<Tensor> alibi_slopes;
  std::optional<Tensor> sinks;
  std::optional<Tensor> cu_seqlens_q;
  std::optional<Tensor> cu_seqlens_k;
};
AttentionTensors load_attention_tensors(const AttentionFlags& flags);

// The library options these flags describe, max_memory set to the whole --max-memory budget;
// the tensors must outlive the options.
AttentionOptions attention_options(const AttentionFlags& flags, const AttentionTensors& tensors);
// The same for a command with none of the version 2 flag groups: the mask is the only tensor.
AttentionOptions attention_options(const AttentionFlags& flags, const std::optional<Tensor>& mask);

// The flag's spelling of a library option named as an error's subject ("softcap" ->
// "--softcap", "return_weights" -> "--weights"); any other subject (a file) as it is.
std::string flag_for_subject(const std::string& subject);

// Reads a tensor argument: "FILE.npy", "FILE.safetensors:NAME" or "FILE.npz:NAME".
Tensor read_input(const std::string& spec);
// Its header alone (inspect_tensor), and some of its rows alone (read_tensor_rows).
TensorInfo inspect_input(const std::string& spec);
Tensor read_input_rows(const std::string& spec, std::span<const RowSpan> spans);

// An optional tensor argument: nothing for an empty spec.
std::optional<Tensor> read_optional(const std::string& spec);
std::optional<TensorView> view_of(const std::optional<Tensor>& tensor);

// The memory budget in bytes that --max-memory sets ("8G", "512MiB", "25%" of physical memory,
// "0" or "none" for no limit), or by default kDefaultMemoryFraction of the physical memory (or
// of the cgroup's limit, when lower). Throws qkv::Error naming --max-memory.
std::uint64_t memory_budget(const AttentionFlags& flags);
// The same for a --max-memory given as text (empty: the default), for commands without the
// attention flags (decode, bench --decode).
std::uint64_t memory_budget(const std::string& max_memory);
constexpr double kDefaultMemoryFraction = 0.75;

// The bytes the command's inputs will take once read: the tensors named by `specs` (empty
// ones skipped) and the tensor files of the flags (--mask, --sinks, ...), from their headers
// alone (io's inspect_tensor), before any is read. Throws qkv::Error naming --max-memory if they
// alone exceed the budget, so that an input too large for it is refused without being read. 0
// when there is no budget (--max-memory 0).
std::uint64_t check_input_sizes(const AttentionFlags& flags, const std::vector<std::string>& specs);

// Sets options.max_memory to what is left of the budget once the inputs (`input_bytes`, as
// check_input_sizes counted them) are held; throws qkv::Error naming --max-memory if they alone
// exceed it.
void apply_memory_budget(const AttentionFlags& flags, std::uint64_t input_bytes,
                         AttentionOptions& options);

// Runs a library call, reporting an error about an option (a refused memory budget, say) against
// its flag (flag_for_subject), and a failed allocation as one line naming `what` was running and
// the tensor it could not allocate
// ("attention: out of memory allocating output: 17179869184 bytes (16 GiB) for ...").
template <typename Call>
auto within_memory_budget(const std::string& what, Call&& call) -> decltype(call()) {
  try {
    return call();
  } catch (const core::OutOfMemory& e) {
    throw Error(what, "out of memory allocating " + e.subject() + ": " + e.allocation());
  } catch (const std::bad_alloc&) {
    // An allocation other than a tensor's (a vector inside explain, say): no size to give.
    throw Error(what, "out of memory");
  } catch (const Error& e) {
    const std::string flag = flag_for_subject(e.subject());
    if (flag != e.subject()) throw Error(flag, e.problem());
    throw;
  }
}

// Reads the mask named by --mask, if any.
std::optional<Tensor> load_mask(const AttentionFlags& flags);
// A mask as load_mask holds it: a 16-bit float mask widened to float32, any other as it is.
Tensor widen_mask(Tensor mask, const std::string& spec);

// "L,R" -> Window; throws qkv::Error naming --window.
Window parse_window(const std::string& text);

// --layout: the order of a query's, key's or value's last three dimensions. qkv computes on
// [.., H, N, D] (bhnd, heads first, the default); bnhd ([.., N, H, D], tokens first, as
// transformers and flash-attn keep them) is read as a strided view, and the outputs of Q's,
// K's and V's shape (out, the gradients) are written in it too.
enum class HeadLayout { kHeadsFirst, kTokensFirst };
CLI::Option* add_layout_option(CLI::App& command, std::string& layout,
                               bool writes_tensors = true);
// The layout --layout names; with no --layout, a 3-D query that K and V let be read tokens
// first is refused with one line naming the layouts and --layout, unless heads first gives
// as many query rows as keys (then heads first, as a 3-D input has always been read).
// Packed batches (`packed`) are read heads first unless --layout says otherwise.
HeadLayout resolve_layout(const std::string& layout, const Shape& q, const Shape& k,
                          const Shape& v, bool packed);
// `view` with its dims -3 and -2 swapped under kTokensFirst (its own inverse); as it is under
// kHeadsFirst or with fewer than 3 dims.
TensorView in_layout(const TensorView& view, HeadLayout layout);

struct OutputFile {
  std::string path;
  TensorView tensor;
  std::string flag;  // "--out", "--lse", ...: names the array in an .npz or .safetensors file
};

// The formats an output is written in, by its file's extension: .npy (and a name without an
// extension), .npz (an archive, as np.savez writes it, of one array named after the flag:
// np.load(path)["out"]) and .safetensors (a tensor of that name). Outputs that name the same
// .npz or .safetensors file are written into it together. Any other extension is refused by
// the parser before anything is read: "--out: 'o.txt' has no output format; name it .npy, .npz
// or .safetensors".
enum class OutputFormat { kNpy, kNpz, kSafetensors };
std::optional<OutputFormat> output_format(const std::string& path);
CLI::Validator output_path();
// The check above, on an output flag the parser has added.
CLI::Option* as_output(CLI::Option* option);

// Writes every output in the format its extension names, converted to `dtype`, all or none.
void write_outputs(const std::vector<OutputFile>& outputs, DType dtype);

// Adds the requested extra outputs (--weights, --lse) of a result to `outputs`.
void add_extra_outputs(const AttentionFlags& flags, const Tensor& weights, const Tensor& lse,
                       std::vector<OutputFile>& outputs);

}  // namespace qkv::cli
