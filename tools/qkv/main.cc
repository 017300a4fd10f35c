// qkv: the command line. Thin by design: it parses flags into the library's option structs,
// calls the library, and maps errors to exit codes with exactly one line on stderr.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "commands.h"
#include "qkv/error.h"

namespace {

constexpr int kExitBadInput = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInternal = 3;

// Messages are printed on one line whatever they contain.
std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "qkv: transformer self-attention on the CPU, as the classic explanation of query, key and\n"
      "value describes it: Q = X·W^Q, K = X·W^K, V = X·W^V, O_i = softmax(q_i·K^T·scale)·V."};
  app.set_version_flag("--version", std::string("qkv ") + qkv::version());
  app.require_subcommand(1);
  app.footer("Run 'qkv COMMAND --help' for a command's options and an example.");
  qkv::cli::register_attention_command(app);
  qkv::cli::register_layer_command(app);
  qkv::cli::register_explain_command(app);
  qkv::cli::register_bench_command(app);

  // CLI11 would only say that a subcommand is required; name the word it did not know.
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      found = found || sub->get_name() == argv[1];
      known += (known.empty() ? "" : ", ") + sub->get_name();
    }
    if (!found) {
      std::fprintf(stderr, "qkv: unknown command '%s' (commands: %s)\n", argv[1], known.c_str());
      return kExitUsage;
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help on a subcommand, --version
    std::fprintf(stderr, "qkv: %s (see qkv --help)\n", one_line(e.what()).c_str());
    return kExitUsage;
  } catch (const qkv::Error& e) {
    std::fprintf(stderr, "%s\n", one_line(e.what()).c_str());
    return kExitBadInput;
  } catch (const std::bad_alloc&) {
    // The last resort: the commands name what they were reading, computing or writing when an
    // allocation fails, but not every small allocation sits inside one of them (the explain
    // page's text, say). Not a bug in qkv but a limit the run hit, like a refused budget.
    std::fputs("qkv: out of memory\n", stderr);
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qkv: internal error: %s\n", one_line(e.what()).c_str());
    return kExitInternal;
  }
  return 0;
}
