// Memory while reading inputs: --max-memory counts the inputs from their headers before reading
// any, F16/BF16 are kept as stored (16 bits an element, no float32 copy), and an allocation that
// fails (under RLIMIT_AS, `ulimit -v`) is one line naming what was being read or computed.
//
// The large inputs are sparse files: a valid header, then ftruncate to the data's size, so that
// gigabytes of zeros cost no disk and reading them costs no I/O.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "io/safetensors_builder.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/test_support.h"

// Sanitizers reserve terabytes of address space (no RLIMIT_AS fits them) and inflate the RSS:
// the measurements below mean nothing under them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define QKV_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define QKV_UNDER_SANITIZER 1
#endif
#endif
#ifndef QKV_UNDER_SANITIZER
#define QKV_UNDER_SANITIZER 0
#endif

namespace qkv {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

// A run of the CLI with what wait4 says about it: the peak resident set and the wall time.
struct MeasuredRun {
  int status = -1;
  std::string err;
  std::uint64_t max_rss = 0;  // bytes
  double seconds = 0;
};

// Runs build/qkv `args` in `dir`, under RLIMIT_AS = `address_space` bytes when not 0.
MeasuredRun run_measured(const std::filesystem::path& dir, const std::vector<std::string>& args,
                         std::uint64_t address_space = 0) {
  const std::filesystem::path err_file = dir.parent_path() / (dir.filename().string() + ".err");
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    if (chdir(dir.c_str()) != 0) _exit(126);
    const int null = open("/dev/null", O_WRONLY);
    const int err = open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(null, 1);
    dup2(err, 2);
    if (address_space != 0) {
      const rlimit limit{address_space, address_space};
      if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(125);
    }
    // OpenBLAS starts a worker per core at load, each taking a 128 MiB buffer, and a worker
    // whose buffer does not fit retries for ever while qkv waits to join it (kernels/
    // blas_threads.cc): without workers the address space a run needs is qkv's own. The alarm
    // (which survives exec) turns any such hang into a failed run instead of a stuck test.
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    alarm(60);
    std::vector<std::string> copy = args;
    std::string program = QKV_CLI_PATH;
    std::vector<char*> argv = {program.data()};
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(program.c_str(), argv.data());
    _exit(127);
  }
  int wstatus = 0;
  rusage usage{};
  wait4(pid, &wstatus, 0, &usage);
  MeasuredRun run;
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  run.max_rss = static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;  // Linux: KiB
  run.err = testing::slurp(err_file);
  std::filesystem::remove(err_file);
  return run;
}

std::string python_shape(const Shape& shape) {
  std::string text = "(";
  for (const std::int64_t dim : shape) text += std::to_string(dim) + ", ";
  return text + ")";
}

// Makes `path` `bytes` long without writing the rest: a sparse file of zeros after `head`.
void write_sparse(const std::filesystem::path& path, const std::string& head, std::uint64_t bytes) {
  testing::write_bytes(path, head);
  std::filesystem::resize_file(path, bytes);
}

// The preamble and header of a float32 .npy of `shape`.
std::string npy_head(const Shape& shape) {
  std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': " + python_shape(shape) + "}";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string head = std::string("\x93NUMPY\x01\x00", 8);
  head.push_back(static_cast<char>(header.size() & 0xff));
  head.push_back(static_cast<char>(header.size() >> 8));
  head += header;
  return head;
}

std::uint64_t f32_bytes(const Shape& shape) {
  std::uint64_t bytes = 4;
  for (const std::int64_t dim : shape) bytes *= static_cast<std::uint64_t>(dim);
  return bytes;
}

// A float32 .npy of `shape` holding zeros, sparse.
void write_sparse_npy(const std::filesystem::path& path, const Shape& shape) {
  const std::string head = npy_head(shape);
  write_sparse(path, head, head.size() + f32_bytes(shape));
}

// Little-endian bytes of `value`, as zip headers hold their fields.
std::string le(std::uint64_t value, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  return out;
}

// An .npz archive (as np.savez writes it: a stored member "t.npy") of a float32 .npy of
// `shape`, zeros, sparse; under 4 GiB, so without zip64 fields. The CRC-32 is left 0: only the
// header is ever read.
void write_sparse_npz(const std::filesystem::path& path, const Shape& shape) {
  const std::string head = npy_head(shape);
  const std::uint64_t member = head.size() + f32_bytes(shape);
  const std::string name = "t.npy";
  const auto fields = [&](bool central) {
    return le(20, 2) + (central ? le(20, 2) : "") + le(0, 2) + le(0, 2) + le(0, 4) + le(0, 4) +
           le(member, 4) + le(member, 4) + le(name.size(), 2) + le(0, 2);
  };
  const std::string local = le(0x04034b50, 4) + fields(false) + name;
  const std::string central = le(0x02014b50, 4) + fields(true) + le(0, 2) + le(0, 2) + le(0, 2) +
                              le(0, 4) + le(0, 4) + name;
  const std::uint64_t central_at = local.size() + member;
  const std::string end = le(0x06054b50, 4) + le(0, 2) + le(0, 2) + le(1, 2) + le(1, 2) +
                          le(central.size(), 4) + le(central_at, 4) + le(0, 2);
  write_sparse(path, local + head, central_at);
  std::ofstream(path, std::ios::binary | std::ios::app) << central << end;
}

// A .safetensors file holding one tensor "t" of `dtype` and `shape`, zeros, sparse.
void write_sparse_safetensors(const std::filesystem::path& path, const std::string& dtype,
                              const Shape& shape, std::uint64_t item_size) {
  std::uint64_t bytes = item_size;
  for (const std::int64_t dim : shape) bytes *= static_cast<std::uint64_t>(dim);
  // Only the header is built: the data the builder would append is left to the sparse tail.
  testing::SafetensorsItem item{"t", dtype, shape, "", "[0," + std::to_string(bytes) + "]"};
  const std::string head = testing::safetensors_bytes({item});
  write_sparse(path, head, head.size() + bytes);
}

void expect_one_line(const MeasuredRun& run) {
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
}

TEST(InputMemory, InspectTensorReadsOnlyTheHeader) {
  testing::ScratchDir dir;
  const Tensor small = testing::random_tensor(DType::kF32, {3, 5}, 1);
  write_npy(dir / "a.npy", small.view(), DType::kF64);
  const TensorInfo npy = inspect_tensor((dir / "a.npy").string());
  EXPECT_EQ(npy.name, (dir / "a.npy").string());
  EXPECT_EQ(npy.dtype, DType::kF64);
  EXPECT_EQ(npy.shape, (Shape{3, 5}));
  EXPECT_EQ(npy.bytes, 3u * 5 * 8);
  EXPECT_EQ(npy.bytes, read_tensor((dir / "a.npy").string()).nbytes());

  // 16-bit dtypes are kept as stored: counted at 2 bytes an element.
  const struct {
    const char* dtype;
    DType in_memory;
    std::uint64_t item;
  } kinds[] = {{"F16", DType::kF16, 2}, {"BF16", DType::kBF16, 2}, {"F32", DType::kF32, 4}};
  for (const auto& kind : kinds) {
    testing::write_bytes(
        dir / "m.safetensors",
        testing::safetensors_bytes({testing::safetensors_item("w", small, kind.dtype)}));
    const std::string spec = (dir / "m.safetensors").string() + ":w";
    const TensorInfo info = inspect_tensor(spec);
    EXPECT_EQ(info.name, spec);
    EXPECT_EQ(info.dtype, kind.in_memory) << kind.dtype;
    EXPECT_EQ(info.shape, (Shape{3, 5})) << kind.dtype;
    EXPECT_EQ(info.bytes, 3u * 5 * kind.item) << kind.dtype;
    EXPECT_EQ(info.bytes, read_tensor(spec).nbytes()) << kind.dtype;
  }

  // A 2 GiB input is inspected without being read; a damaged one fails as reading it would.
  write_sparse_npy(dir / "big.npy", {8192, 65536});
  EXPECT_EQ(inspect_tensor((dir / "big.npy").string()).bytes, std::uint64_t{2} << 30);
  std::filesystem::resize_file(dir / "big.npy", 4096);
  try {
    inspect_tensor((dir / "big.npy").string());
    FAIL() << "a truncated file was inspected";
  } catch (const Error& e) {
    EXPECT_NE(e.problem().find("header claims"), std::string::npos) << e.what();
  }
  EXPECT_THROW(inspect_tensor((dir / "m.safetensors").string() + ":nope"), Error);
  EXPECT_THROW(inspect_tensor((dir / "m.safetensors").string()), Error);
}

// A large 16-bit tensor comes out of the file bit for bit, in its own dtype.
TEST(InputMemory, SixteenBitTensorsAreKeptAsStored) {
  testing::ScratchDir dir;
  const Tensor values = testing::random_tensor(DType::kF32, {7, 15001}, 2, -100.0, 100.0);
  for (const char* dtype : {"F16", "BF16"}) {
    const testing::SafetensorsItem item = testing::safetensors_item("w", values, dtype);
    testing::write_bytes(dir / "m.safetensors", testing::safetensors_bytes({item}));
    const Tensor read = read_tensor((dir / "m.safetensors").string() + ":w");
    ASSERT_EQ(read.shape(), values.shape());
    EXPECT_EQ(read.dtype(), std::string(dtype) == "F16" ? DType::kF16 : DType::kBF16);
    ASSERT_EQ(read.nbytes(), item.bytes.size());
    EXPECT_EQ(std::memcmp(read.data(), item.bytes.data(), item.bytes.size()), 0) << dtype;
    EXPECT_LE(testing::max_abs_diff(read.view(), values.view()), 0.5) << dtype;
  }
}

// --max-memory counts the inputs from their headers: a 2 GiB input under a 64 MiB budget is
// refused before it is read, for every command and every kind of input.
TEST(InputMemory, InputsOverTheBudgetAreRefusedBeforeReading) {
  if (QKV_UNDER_SANITIZER) GTEST_SKIP() << "RSS under a sanitizer measures the sanitizer";
  testing::ScratchDir dir;
  write_sparse_npy(dir / "big.npy", {8192, 65536});                             // 2 GiB of float32
  write_sparse_safetensors(dir / "big.safetensors", "F16", {16384, 65536}, 2);  // 2 GiB as stored
  write_sparse_npz(dir / "big.npz", {8192, 65536});  // 2 GiB, a stored member
  const Tensor small = testing::random_tensor(DType::kF32, {4, 8}, 3);
  write_npy(dir / "s.npy", small.view(), DType::kF32);
  const Tensor w = testing::random_tensor(DType::kF32, {8, 8}, 4);
  write_npy(dir / "w.npy", w.view(), DType::kF32);
  const std::vector<std::vector<std::string>> commands = {
      {"attention", "--q", "big.npy", "--k", "s.npy", "--v", "s.npy", "--out", "o.npy"},
      {"attention", "--q", "s.npy", "--k", "s.npy", "--v", "big.safetensors:t", "--out", "o.npy"},
      {"attention", "--q", "s.npy", "--k", "s.npy", "--v", "s.npy", "--mask", "big.npy", "--out",
       "o.npy"},
      {"attention", "--q", "s.npy", "--k", "big.npz:t", "--v", "s.npy", "--out", "o.npy"},
      {"layer", "--x", "big.npy", "--wq", "w.npy", "--wk", "w.npy", "--wv", "w.npy", "--heads", "1",
       "--out", "o.npy"},
      {"layer", "--x", "s.npy", "--wq", "w.npy", "--wk", "w.npy", "--wv", "w.npy", "--wo",
       "big.safetensors:t", "--heads", "1", "--out", "o.npy"},
      {"layer", "--x", "s.npy", "--wq", "big.npz:t", "--wk", "w.npy", "--wv", "w.npy", "--heads",
       "1", "--out", "o.npy"},
      {"explain", "--q", "big.npy", "--k", "s.npy", "--v", "s.npy"},
      {"explain", "--x", "s.npy", "--wq", "w.npy", "--wk", "w.npy", "--wv", "w.npy", "--heads", "1",
       "--memory", "big.npy"},
  };
  for (std::vector<std::string> args : commands) {
    args.insert(args.end(), {"--max-memory", "64M"});
    const MeasuredRun run = run_measured(dir.path(), args);
    const std::string shown = args[0] + " " + args[2] + " ...";
    EXPECT_EQ(run.status, 1) << shown << ": " << run.err;
    expect_one_line(run);
    EXPECT_EQ(run.err.rfind("--max-memory: the inputs alone take 21474", 0), 0u)
        << shown << ": " << run.err;
    EXPECT_NE(run.err.find("(2 GiB); the memory budget is 67108864 bytes (64 MiB)"),
              std::string::npos)
        << shown << ": " << run.err;
    // Reading the input would take 2 GiB of resident memory and about a second.
    EXPECT_LT(run.max_rss, 64 * kMiB) << shown;
    EXPECT_LT(run.seconds, 1.0) << shown;
    EXPECT_FALSE(std::filesystem::exists(dir / "o.npy"));
  }
}

// The peak resident set of a command that reads an F16 tensor: the tensor as stored and the
// process, neither a float32 copy (twice the size) nor a raw copy of the file's data beside it.
TEST(InputMemory, SixteenBitInputsPeakNearTheirStoredSize) {
  if (QKV_UNDER_SANITIZER) GTEST_SKIP() << "RSS under a sanitizer measures the sanitizer";
  testing::ScratchDir dir;
  const Tensor k = testing::random_tensor(DType::kF32, {1, 4, 8}, 5);
  write_npy(dir / "k.npy", k.view(), DType::kF32);
  // [1, 32768, 2048] F16: 128 MiB in the file and in memory. K's width 8 differs from Q's 2048,
  // so the run stops, once Q is read, at validation: what it held is the inputs.
  write_sparse_safetensors(dir / "q.safetensors", "F16", {1, 32768, 2048}, 2);
  write_sparse_safetensors(dir / "tiny.safetensors", "F16", {1, 4, 2048}, 2);
  const auto run_with = [&](const char* q) {
    return run_measured(dir.path(), {"attention", "--q", q, "--k", "k.npy", "--v", "k.npy", "--out",
                                     "o.npy", "--threads", "1"});
  };
  const MeasuredRun baseline = run_with("tiny.safetensors:t");
  const MeasuredRun run = run_with("q.safetensors:t");
  for (const MeasuredRun* r : {&baseline, &run}) {
    EXPECT_EQ(r->status, 1) << r->err;
    EXPECT_NE(r->err.find("k.npy"), std::string::npos) << r->err;
  }
  const std::uint64_t stored = 128 * kMiB;
  const std::uint64_t added = run.max_rss - std::min(run.max_rss, baseline.max_rss);
  RecordProperty("peak_rss_over_baseline_mib", std::to_string(added / kMiB));
  EXPECT_GT(added, stored * 9 / 10);
  // A float32 copy would add 256 MiB (3x), a raw copy 128 MiB (2x). Allow 10% for the allocator.
  EXPECT_LT(added, stored * 11 / 10)
      << "peak " << run.max_rss / kMiB << " MiB, baseline " << baseline.max_rss / kMiB << " MiB";
}

// The smallest address space in which `qkv attention` on tiny inputs runs to the end: the
// process itself (libraries, OpenBLAS's buffers, thread stacks), found by bisection.
std::uint64_t address_space_of_a_small_run(const std::filesystem::path& dir) {
  std::uint64_t lo = 32 * kMiB;
  std::uint64_t hi = 544 * kMiB;
  while (hi - lo > 16 * kMiB) {
    const std::uint64_t mid = (lo + hi) / 2;
    const MeasuredRun run = run_measured(dir,
                                         {"attention", "--q", "k.npy", "--k", "k.npy", "--v",
                                          "k.npy", "--out", "small.npy", "--threads", "1"},
                                         mid);
    (run.status == 0 ? hi : lo) = mid;
  }
  return hi;
}

// Under `ulimit -v`, an input or an output that does not fit is one line naming the file or
// the computation and exit status 1: no std::bad_alloc, no crash.
TEST(InputMemory, AllocationFailuresNameTheirSubject) {
  if (QKV_UNDER_SANITIZER) GTEST_SKIP() << "sanitizers reserve more address space than any limit";
  testing::ScratchDir dir;
  const Tensor k = testing::random_tensor(DType::kF32, {1, 4, 8}, 6);
  write_npy(dir / "k.npy", k.view(), DType::kF32);
  const Tensor row = testing::random_tensor(DType::kF32, {1, 8192, 8}, 7);
  write_npy(dir / "rows.npy", row.view(), DType::kF32);
  write_sparse_npy(dir / "q256.npy", {1, 8192, 8192});                          // 256 MiB
  write_sparse_safetensors(dir / "q.safetensors", "F16", {1, 16384, 4096}, 2);  // 128 MiB as stored
  const std::uint64_t base = address_space_of_a_small_run(dir.path());
  RecordProperty("address_space_of_a_small_run_mib", std::to_string(base / kMiB));
  // Room for the process and 160 MiB more: not for a 256 MiB input or output.
  const std::uint64_t limit = base + 160 * kMiB;

  // An input that does not fit: the reader names the file and the bytes.
  const MeasuredRun input =
      run_measured(dir.path(),
                   {"attention", "--q", "q256.npy", "--k", "k.npy", "--v", "k.npy", "--out",
                    "o.npy", "--threads", "1", "--max-memory", "0"},
                   limit);
  EXPECT_EQ(input.status, 1) << input.err;
  expect_one_line(input);
  EXPECT_EQ(input.err.rfind("q256.npy: out of memory reading 268435456 bytes (256 MiB)", 0), 0u)
      << input.err;

  // An output that does not fit: the weights of 8192 x 8192 rows, 256 MiB.
  const MeasuredRun output =
      run_measured(dir.path(),
                   {"attention", "--q", "rows.npy", "--k", "rows.npy", "--v", "rows.npy", "--out",
                    "o.npy", "--weights", "w.npy", "--threads", "1", "--max-memory", "0"},
                   limit);
  EXPECT_EQ(output.status, 1) << output.err;
  expect_one_line(output);
  EXPECT_EQ(output.err.rfind("attention: out of memory allocating weights: 268435456 bytes", 0), 0u)
      << output.err;

  // An output that fits but whose encoding beside it does not: the weights of 5120 x 5120
  // rows are 100 MiB, their .npy bytes 100 MiB more. The file is named, and nothing written.
  const Tensor rows5120 = testing::random_tensor(DType::kF32, {1, 5120, 8}, 8);
  write_npy(dir / "rows5120.npy", rows5120.view(), DType::kF32);
  const MeasuredRun encoding = run_measured(
      dir.path(),
      {"attention", "--q", "rows5120.npy", "--k", "rows5120.npy", "--v", "rows5120.npy", "--out",
       "o.npy", "--weights", "w.npy", "--threads", "1", "--max-memory", "0"},
      limit);
  EXPECT_EQ(encoding.status, 1) << encoding.err;
  expect_one_line(encoding);
  EXPECT_EQ(encoding.err.rfind("w.npy: out of memory writing it: 104857728 bytes (100 MiB)", 0), 0u)
      << encoding.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "w.npy"));

  // An F16 input kept as stored (128 MiB) fits the limit that its float32 tensor (256 MiB) would
  // not: it loads, and the run goes on to the next problem (K's width).
  const MeasuredRun f16 =
      run_measured(dir.path(),
                   {"attention", "--q", "q.safetensors:t", "--k", "k.npy", "--v", "k.npy", "--out",
                    "o.npy", "--threads", "1", "--max-memory", "0"},
                   limit);
  EXPECT_EQ(f16.status, 1) << f16.err;
  expect_one_line(f16);
  EXPECT_EQ(f16.err.rfind("k.npy: ", 0), 0u) << f16.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "o.npy"));
}

}  // namespace
}  // namespace qkv
