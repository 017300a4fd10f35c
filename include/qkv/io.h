// NumPy .npy files in and out. Reading trusts nothing in the file; writing never leaves a
// partial or damaged output (temporary file, then rename).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "qkv/tensor.h"

namespace qkv {

// Reads a version 1.0, 2.0 or 3.0 .npy file holding C-order little-endian float32 ('<f4'),
// float64 ('<f8') or bool ('|b1'). The tensor's name is the path. Anything else — a bad magic,
// a header past the end of the file, a shape whose size overflows or that claims more data than
// the file holds, Fortran order, big-endian, integers, float16, objects, an .npz archive — throws
// qkv::Error naming the file, before any large allocation.
Tensor read_npy(const std::filesystem::path& path);

// The bytes of an .npy file (version 1.0, or 2.0 when the header needs it) holding `view`
// converted to `dtype`.
std::vector<char> encode_npy(const TensorView& view, DType dtype);

// A set of output files that appear together or not at all. stage() writes each to a temporary
// file beside its destination; commit() renames them all into place. Destroying an uncommitted
// set removes its temporary files, so a failure leaves every existing output untouched.
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

// Writes one .npy file atomically.
void write_npy(const std::filesystem::path& path, const TensorView& view, DType dtype);

}  // namespace qkv
