// NumPy .npy files in and out. Reading trusts nothing in the file; writing never leaves a
// partial or damaged output (temporary file, then rename).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "qkv/tensor.h"

namespace qkv {

// Reads a version 1.0, 2.0 or 3.0 .npy file holding C-order little-endian float32 ('<f4'),
// float64 ('<f8'), float16 ('<f2', kept as stored: a kF16 tensor) or bool ('|b1'). The tensor's
// name is the path. Anything else — a bad magic, a header past the end of the file, a shape
// whose size overflows or that claims more data than the file holds, Fortran order, big-endian,
// integers (read_npy_offsets reads those), objects, an .npz archive (read_npz_tensor reads
// those) — throws qkv::Error naming the file, before any large allocation.
Tensor read_npy(const std::filesystem::path& path);

// What reading a tensor will produce, known from the file's header alone: nothing but the
// header is read, and nothing larger than it allocated.
struct TensorInfo {
  std::string name;           // as the reader names the tensor: "PATH" or "PATH:NAME"
  DType dtype = DType::kF32;  // in memory once read: as stored (F16 and BF16 included)
  Shape shape;
  std::uint64_t bytes = 0;  // the tensor will take in memory once read
};

// The header of an .npy file, validated exactly as read_npy validates it (same errors).
TensorInfo inspect_npy(const std::filesystem::path& path);

// Reads the sequence offsets of a packed batch (AttentionOptions::cu_seqlens_q/k), the one kind
// of .npy file that holds integers: little-endian int32 ('<i4', a kI32 tensor) or int64 ('<i8',
// kI64), as stored, with read_npy's checks of everything else. Any other dtype (float offsets
// included) throws qkv::Error naming the file; the values (rank, start, order, end) are for
// attention() to check. The tensor's name is the path.
Tensor read_npy_offsets(const std::filesystem::path& path);

// The header of a sequence-offsets file, validated exactly as read_npy_offsets validates it.
TensorInfo inspect_npy_offsets(const std::filesystem::path& path);

// The bytes of an .npy file (version 1.0, or 2.0 when the header needs it) holding `view`
// converted to `dtype` (kF16 is written as '<f2'; kBF16, which NumPy lacks, throws).
std::vector<char> encode_npy(const TensorView& view, DType dtype);

// A set of output files that appear together or not at all. stage() checks a destination (a
// name that fits its folder, a writable folder, not a directory, FIFO or device, not another
// output of the set under another spelling; a symbolic link is written through to its file)
// and writes it to a temporary file beside it; commit() renames them all into place, holding a
// flock on each destination folder, and puts back the outputs already renamed if a later rename
// fails. Destroying an uncommitted set removes its temporary files, so a failure leaves every
// existing output untouched.
class OutputFiles {
 public:
  OutputFiles();
  ~OutputFiles();
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;

  void stage(const std::filesystem::path& path, const std::vector<char>& bytes);
  void stage_npy(const std::filesystem::path& path, const TensorView& view, DType dtype);
  void commit();

 private:
  struct Staged;
  std::vector<Staged> staged_;
};

// Temporary files and signals: the library itself never installs a signal handler (a library
// leaves the process's dispositions as it found them). A program that wants the temporary
// files of outputs being written removed when it is ended by SIGINT, SIGTERM, SIGHUP, SIGQUIT,
// SIGXFSZ, SIGXCPU, SIGUSR1, SIGUSR2, SIGPIPE or SIGALRM calls this once, early: for each of
// those signals whose disposition is still the default, it installs a handler that removes
// them and then re-raises the signal with its default action, so the process ends as it would
// have. Signals the program handles itself are left alone. The qkv executable calls it at
// startup. Idempotent; thread-safe. A signal that arrives while OutputFiles::commit() renames
// its outputs takes effect once the last is in place, whichever thread takes it (the handler
// waits for the renames), so a set of outputs is all old or all new. qkv's own worker threads
// block these ten signals, so that a signal sent to the process reaches one of the program's
// threads.
void install_output_cleanup_on_signals();

// Writes one .npy file atomically.
void write_npy(const std::filesystem::path& path, const TensorView& view, DType dtype);

// One tensor listed in a .safetensors header.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as the file says it: "F32", "BF16", "I64", ...
  Shape shape;
  std::uint64_t begin = 0;  // data_offsets, relative to the start of the data buffer
  std::uint64_t end = 0;
};

// The tensors of a .safetensors file (https://github.com/huggingface/safetensors), sorted by
// their offsets, after validating the whole header as the reference implementation does: an
// 8-byte little-endian header length with an upper bound, a JSON object header ('__metadata__'
// tolerated), a known dtype, shape and data_offsets for every tensor, offsets consistent with
// dtype and shape, sorted, contiguous, without overlap or overflow, and a data buffer that ends
// exactly at the end of the file. Throws qkv::Error naming the file otherwise.
std::vector<SafetensorsEntry> list_safetensors(const std::filesystem::path& path);

// Reads tensor `name` of a .safetensors file as stored: F32, F64, F16, BF16 and BOOL (kF32,
// kF64, kF16, kBF16, kBool); other dtypes are refused. The tensor's name is "PATH:NAME".
Tensor read_safetensors_tensor(const std::filesystem::path& path, const std::string& name);

// Every tensor of a .safetensors file, in the order of their data, each as
// read_safetensors_tensor reads it, the header parsed once (a file of many small tensors is
// read in time linear in its size). One tensor of an unsupported dtype refuses the whole file.
std::vector<std::pair<std::string, Tensor>> read_safetensors(const std::filesystem::path& path);

// Tensor `name` of a .safetensors file as read_safetensors_tensor would read it, from the
// header alone (same errors).
TensorInfo inspect_safetensors_tensor(const std::filesystem::path& path, const std::string& name);

// The bytes of a .safetensors file holding `tensors` (name, view) in the order given, each in its
// own dtype (little-endian, as this machine stores it). A name given twice, empty, or
// "__metadata__" throws qkv::Error. Write them with OutputFiles::stage.
std::vector<char> encode_safetensors(
    const std::vector<std::pair<std::string, TensorView>>& tensors);

// The bytes of an .npz archive holding `arrays` (name, view) in the order given, as np.savez
// writes one: each a stored member NAME.npy, encode_npy's bytes of the view converted to
// `dtype`. A name given twice, empty, ".", "..", or holding '/', '\' or NUL throws qkv::Error.
// Write them with OutputFiles::stage.
std::vector<char> encode_npz(const std::vector<std::pair<std::string, TensorView>>& arrays,
                             DType dtype);

// The arrays of an .npz archive (np.savez, np.savez_compressed), by the names they are read by:
// "q" for the member "q.npy" (a member named without .npy keeps its name). Members whose names
// hold '/' or '\' are left out: they are never read. The archive is opened as
// read_npz_tensor opens it (same errors).
std::vector<std::string> list_npz(const std::filesystem::path& path);

// Reads array `name` of an .npz archive: the member NAME, else NAME.npy, stored or deflated,
// through read_npy's checks of everything in it. The archive is distrusted as a .npy file is:
// its zip directory is checked for consistency (libzip's ZIP_CHECKCONS) and for a name given
// twice; an encrypted member, another compression method, a declared size deflate cannot reach
// from the compressed size (a zip bomb), a size unlike what the .npy header describes, data
// longer or shorter than declared and a bad CRC-32 all throw qkv::Error naming "PATH:NAME" (or
// PATH, for the archive as a whole), before anything larger than the .npy header is allocated.
// NAME with '/' or '\', ".", or ".." names nothing. The tensor's name is "PATH:NAME".
Tensor read_npz_tensor(const std::filesystem::path& path, const std::string& name);

// Array `name` of an .npz archive as read_npz_tensor would read it, from its .npy header alone
// (only the header is inflated; same errors, except those found only by reading the data: its
// length and its CRC-32).
TensorInfo inspect_npz_tensor(const std::filesystem::path& path, const std::string& name);

// The whole of a small file (labels, say), opened as inputs are: anything but a regular file (a
// FIFO, a device, a socket) is refused without blocking, and so is a file above `max_bytes`
// ("is larger than the 64 MiB a labels file may hold", `what` being "a labels file"). Throws
// qkv::Error naming the file.
std::string read_text_file(const std::filesystem::path& path, std::uint64_t max_bytes,
                           const std::string& what);

// A tensor named the way the command line names one: "FILE.npy" (or any path: read as .npy),
// "FILE.safetensors:NAME" for the tensor NAME inside a safetensors file, or "FILE.npz:NAME" for
// the array NAME (member NAME.npy) of an .npz archive. The first ".safetensors:" or ".npz:" ends
// the file's name.
Tensor read_tensor(const std::string& spec);

// The tensor `spec` names, as read_tensor would read it, from the file's header alone: what a
// memory budget needs to refuse an input before reading it.
TensorInfo inspect_tensor(const std::string& spec);

// Rows [first, last) along a tensor's second-to-last axis.
struct RowSpan {
  std::int64_t first = 0;
  std::int64_t last = 0;
};

// Some rows of the tensor `spec` names (read_tensor's spelling): along its second-to-last axis,
// the rows of `spans` (ascending, disjoint, within the rows; inspect_tensor gives their count)
// in that order, for every index of the leading axes. The result has the tensor's shape with
// that axis the spans' total. Only those rows' bytes are read from an .npy file, a safetensors
// file or a stored .npz member (np.savez), at their offsets; a deflated member
// (np.savez_compressed) is inflated as a stream to its end, its CRC-32 checked, keeping only
// those rows. The checks and errors of read_tensor; spans that break the rule, or a tensor of
// fewer than 2 dims, throw qkv::Error naming the tensor. What each rank of ring attention
// reads of its inputs.
Tensor read_tensor_rows(const std::string& spec, std::span<const RowSpan> spans);

// read_tensor_rows for each kind of file, as read_npy, read_safetensors_tensor and
// read_npz_tensor read the whole tensor.
Tensor read_npy_rows(const std::filesystem::path& path, std::span<const RowSpan> spans);
Tensor read_safetensors_tensor_rows(const std::filesystem::path& path, const std::string& name,
                                    std::span<const RowSpan> spans);
Tensor read_npz_tensor_rows(const std::filesystem::path& path, const std::string& name,
                            std::span<const RowSpan> spans);

}  // namespace qkv
