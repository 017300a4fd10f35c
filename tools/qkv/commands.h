// The qkv subcommands. Each registers itself on the app; its callback runs the command and
// throws qkv::Error on bad input (main turns that into one stderr line and exit status 1).
#pragma once

#include <CLI/CLI.hpp>

namespace qkv::cli {

void register_attention_command(CLI::App& app);
void register_layer_command(CLI::App& app);
void register_explain_command(CLI::App& app);
void register_bench_command(CLI::App& app);
void register_decode_command(CLI::App& app);
void register_train_command(CLI::App& app);

}  // namespace qkv::cli
