// Fuzz target: the .npy readers (values, and the integer sequence offsets). Any input must
// either load (and then survive a round trip through encode_npy bit for bit) or throw
// qkv::Error with a one-line message.
#include <cstdint>
#include <cstring>
#include <filesystem>

#include "fuzz/fuzz_util.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace {

void check_reader(const std::filesystem::path& path, std::size_t size,
                  qkv::Tensor (*read)(const std::filesystem::path&)) {
  qkv::Tensor tensor;
  try {
    tensor = read(path);
  } catch (const qkv::Error& e) {
    qkv::fuzz::check_one_line(e.what());
    return;
  }
  if (tensor.nbytes() > size) qkv::fuzz::fail("the tensor is larger than the file it came from");
  const std::vector<char> bytes = qkv::encode_npy(tensor.view(), tensor.dtype());
  const qkv::fuzz::MemoryFile again(bytes.data(), bytes.size());
  const qkv::Tensor back = read(again.path());
  if (back.shape() != tensor.shape() || back.dtype() != tensor.dtype() ||
      (tensor.nbytes() > 0 && std::memcmp(back.data(), tensor.data(), tensor.nbytes()) != 0)) {
    qkv::fuzz::fail("encode_npy/read round trip changed the tensor");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const qkv::fuzz::MemoryFile file(data, size);
  check_reader(file.path(), size, &qkv::read_npy);
  try {
    qkv::fuzz::check_rows(qkv::read_npy(file.path()), [&](std::span<const qkv::RowSpan> spans) {
      return qkv::read_npy_rows(file.path(), spans);
    });
  } catch (const qkv::Error&) {  // check_reader has seen this error
  }
  check_reader(file.path(), size, &qkv::read_npy_offsets);
  return 0;
}
