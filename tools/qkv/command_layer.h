// What qkv layer (command_layer.cc) and qkv layer --ring (command_layer_ring.cc) share: the
// command's flags and how its gradients become outputs.
#pragma once

#include <string>
#include <vector>

#include "cli_common.h"
#include "layer_weights.h"
#include "qkv/dist.h"
#include "qkv/layer_backward.h"
#include "run_report.h"

namespace qkv::cli {

// --grad-out and where each of the layer's gradients goes (docs/interface.md, "Gradients").
struct LayerGradientFlags {
  std::string grad_out, x, memory, wq, wk, wv, wo, bq, bk, bv, bo;
  bool wanted() const {
    for (const std::string* path : {&x, &memory, &wq, &wk, &wv, &wo, &bq, &bk, &bv, &bo}) {
      if (!path->empty()) return true;
    }
    return false;
  }
};

struct LayerCommand {
  std::string x_path, memory_path, out_path;
  bool ring = false;
  WeightFlags weights;
  LayerGradientFlags gradients;
  AttentionFlags flags;
  ReportFlags report;
};

// The gradients the flags ask for, added to `outputs` (written with the others, all or none).
// A weight given in nn.Linear's layout (--linear-layout) gets its gradient in that layout too;
// `transposed` holds those copies.
void add_gradients(const LayerCommand& command, const LayerGradients& g,
                   std::vector<Tensor>& transposed, std::vector<OutputFile>& outputs);

// Refuses --grad-out without a --grad-* output, and weight gradients with fused weights.
void check_gradient_flags(const LayerCommand& command);

// The flags qkv layer --ring refuses, as the user spelled them (empty: none).
std::string layer_ring_refusals(const LayerCommand& command);

// qkv layer --ring on this rank (run_on_ranks's body).
void run_layer_ring(const LayerCommand& command, const dist::Communicator& comm, int ranks, int me);

}  // namespace qkv::cli
