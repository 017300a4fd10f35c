// What `qkv attention` and `qkv layer` share: the attention flags, loading inputs, and writing
// every output together or not at all.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/tensor.h"

namespace qkv::cli {

// The flags of every option of `qkv attention` but the inputs and --out.
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
};

void add_attention_flags(CLI::App& command, AttentionFlags& flags);

// The library options these flags describe; the mask (when given) must outlive the options.
AttentionOptions attention_options(const AttentionFlags& flags, const std::optional<Tensor>& mask);

// Reads the mask named by --mask, if any.
std::optional<Tensor> load_mask(const AttentionFlags& flags);

// "L,R" -> Window; throws qkv::Error naming --window.
Window parse_window(const std::string& text);

struct OutputFile {
  std::string path;
  TensorView tensor;
};

// Writes every output as .npy of `dtype`, all or none.
void write_outputs(const std::vector<OutputFile>& outputs, DType dtype);

// Adds the requested extra outputs (--weights, --lse) of a result to `outputs`.
void add_extra_outputs(const AttentionFlags& flags, const Tensor& weights, const Tensor& lse,
                       std::vector<OutputFile>& outputs);

}  // namespace qkv::cli
