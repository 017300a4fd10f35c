// Fuzz target: the safetensors reader. Any input must either validate (and then every listed
// tensor of a supported dtype loads with the size its entry promises) or throw qkv::Error with
// a one-line message.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "qkv/error.h"
#include "qkv/io.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const qkv::fuzz::MemoryFile file(data, size);
  std::vector<qkv::SafetensorsEntry> entries;
  try {
    entries = qkv::list_safetensors(file.path());
  } catch (const qkv::Error& e) {
    qkv::fuzz::check_one_line(e.what());
    return 0;
  }
  std::uint64_t previous_end = 0;
  for (const qkv::SafetensorsEntry& entry : entries) {
    if (entry.begin != previous_end || entry.end < entry.begin || entry.end > size) {
      qkv::fuzz::fail("validated entries are not contiguous within the file");
    }
    previous_end = entry.end;
  }
  // Each read validates the header again; a few tensors are enough.
  for (std::size_t i = 0; i < entries.size() && i < 8; ++i) {
    const qkv::SafetensorsEntry& entry = entries[i];
    try {
      const qkv::Tensor t = qkv::read_safetensors_tensor(file.path(), entry.name);
      if (t.shape() != entry.shape) qkv::fuzz::fail("loaded shape differs from the header's");
      // Every supported dtype, F16 and BF16 included, is kept as stored.
      if (t.nbytes() != entry.end - entry.begin) {
        qkv::fuzz::fail("loaded size differs from the header's");
      }
      qkv::fuzz::check_rows(t, [&](std::span<const qkv::RowSpan> spans) {
        return qkv::read_safetensors_tensor_rows(file.path(), entry.name, spans);
      });
    } catch (const qkv::Error& e) {
      qkv::fuzz::check_one_line(e.what());
    }
  }
  return 0;
}
