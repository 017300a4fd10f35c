// Fuzz target: the .npz reader (libzip underneath, the .npy parser on each member). Any input
// must either give arrays whose header peek and read agree, each no larger than deflate can
// make of the input, or throw qkv::Error with a one-line message.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace {

// Deflate's largest ratio (1032 to 1) plus the slack the reader allows a tiny stream.
constexpr std::uint64_t kMaxRatio = 1032;
constexpr std::uint64_t kSlack = 1024;

void read_one(const std::string& path, const std::string& name, std::size_t input_size) {
  qkv::TensorInfo info;
  try {
    info = qkv::inspect_npz_tensor(path, name);
  } catch (const qkv::Error& e) {
    qkv::fuzz::check_one_line(e.what());
  }
  try {
    const qkv::Tensor t = qkv::read_npz_tensor(path, name);
    if (t.nbytes() > input_size * kMaxRatio + kSlack) {
      qkv::fuzz::fail("a member read larger than deflate can make of the input");
    }
    if (t.shape() != info.shape || t.dtype() != info.dtype || t.nbytes() != info.bytes) {
      qkv::fuzz::fail("the read tensor differs from what inspect_npz_tensor said");
    }
    qkv::fuzz::check_rows(t, [&](std::span<const qkv::RowSpan> spans) {
      return qkv::read_npz_tensor_rows(path, name, spans);
    });
  } catch (const qkv::Error& e) {
    qkv::fuzz::check_one_line(e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const qkv::fuzz::MemoryFile file(data, size);
  std::vector<std::string> names;
  try {
    names = qkv::list_npz(file.path());
  } catch (const qkv::Error& e) {
    qkv::fuzz::check_one_line(e.what());
    return 0;
  }
  // Each read opens the archive again; a few arrays are enough. 'q' also when it is not
  // there: the refusal that lists the names.
  for (std::size_t i = 0; i < names.size() && i < 4; ++i) read_one(file.path(), names[i], size);
  read_one(file.path(), "q", size);
  return 0;
}
