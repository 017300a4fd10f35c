// qkv: the command line. Thin by design: it parses flags into the library's option structs,
// calls the library, and maps errors to exit codes with exactly one line on stderr.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace {

constexpr int kExitBadInput = qkv::cli::kExitStatusBadInput;
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

// Under mpirun (qkv attention --ring) every rank ends with the same error; rank 0 says it, the
// others stay silent so that the error is one line. OpenMPI, MPICH and PMIx name the rank.
bool silent_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    const char* rank = std::getenv(name);
    if (rank != nullptr && std::strcmp(rank, "0") != 0) return true;
  }
  return false;
}

// OpenBLAS starts its thread pool as it is loaded, before main, and when the system refuses a
// thread (a process limit, a small address space) it prints two lines and raises SIGINT. qkv
// never needs that pool: it runs every BLAS call single-threaded on its own threads
// (kernels/blas_threads.h). A .preinit_array entry of the executable runs after relocation but
// before any shared library's initialiser, so it can tell OpenBLAS it has one thread before
// OpenBLAS counts the cores (setenv there is undone when libc initialises, so the variables are
// set directly; they are weak, and absent from a BLAS that is not OpenBLAS).
extern "C" int blas_cpu_number __attribute__((weak));
extern "C" int blas_num_threads __attribute__((weak));
void no_openblas_pool(int, char**, char**) {
  if (&blas_cpu_number != nullptr && &blas_num_threads != nullptr) {
    blas_cpu_number = 1;
    blas_num_threads = 1;
  }
}
[[gnu::section(".preinit_array"),
  gnu::used]] void (*const kNoOpenblasPool)(int, char**, char**) = no_openblas_pool;

}  // namespace

int main(int argc, char** argv) {
  // The executable, unlike the library, removes its outputs' temporary files when a signal
  // ends it (qkv/io.h).
  qkv::install_output_cleanup_on_signals();
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
  qkv::cli::register_decode_command(app);
  qkv::cli::register_train_command(app);

  // CLI11 would only say that a subcommand is required; name the word it did not know.
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    std::vector<std::string> names;
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      found = found || sub->get_name() == argv[1];
      known += (known.empty() ? "" : ", ") + sub->get_name();
      names.push_back(sub->get_name());
    }
    if (!found) {
      const std::string near = qkv::cli::closest_word(argv[1], names);
      std::fprintf(stderr, "qkv: unknown command '%s'%s (commands: %s)\n", argv[1],
                   near.empty() ? "" : ("; did you mean '" + near + "'?").c_str(), known.c_str());
      return kExitUsage;
    }
  }

  // -v is --verbose (run_report.cc says why CLI11 is not told so). CLI11 reads a word "-v" as
  // a flag wherever it stands, never as an option's value, so rewriting each one changes
  // nothing else.
  std::vector<std::string> words(argv, argv + argc);
  for (std::size_t i = 2; i < words.size(); ++i) {
    if (words[i] == "-v") words[i] = "--verbose";
  }
  std::vector<char*> args;
  for (std::string& word : words) args.push_back(word.data());
  args.push_back(nullptr);

  try {
    app.parse(argc, args.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help on a subcommand, --version
    // One line that names the command and points at its help: "qkv attention: unknown option
    // --Q (see 'qkv attention --help')".
    std::string command = "qkv";
    if (argc > 1 && argv[1][0] != '-') command += std::string(" ") + argv[1];
    if (silent_rank()) return kExitUsage;
    std::fprintf(stderr, "%s: %s (see '%s --help')\n", command.c_str(),
                 one_line(qkv::cli::usage_problem(app, e)).c_str(), command.c_str());
    return kExitUsage;
  } catch (const qkv::cli::AlreadyReported& reported) {
    return reported.status;
  } catch (const qkv::Error& e) {
    if (!silent_rank()) std::fprintf(stderr, "%s\n", one_line(e.what()).c_str());
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
  if (const char* verbose = std::getenv("QKV_VERBOSE"); verbose != nullptr && verbose[0] == '1') {
    if (const std::int64_t missing = qkv::threads_not_started(); missing > 0) {
      std::fprintf(stderr,
                   "qkv: the system refused %lld of the threads asked for; the work ran on the "
                   "threads it allowed, with the same results\n",
                   static_cast<long long>(missing));
    }
  }
  // A report that did not reach its reader is a failure too: with SIGPIPE ignored, a closed pipe
  // (EPIPE) or a full disk behind a redirection would otherwise end with status 0 in silence.
  if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    std::fprintf(stderr, "standard output: cannot write: %s\n", std::strerror(errno));
    return kExitBadInput;
  }
  return 0;
}
