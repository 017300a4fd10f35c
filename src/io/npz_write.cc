// Writing .npz archives: what np.savez writes, a zip archive of .npy files named NAME.npy,
// each stored (not deflated, as np.savez stores them), through libzip as npz.cc reads them.
// The archive is built in memory (a libzip buffer source) and returned as bytes, for
// OutputFiles to stage and commit with the other outputs of a run. Every member's time is
// 1980-01-01 00:00 (the earliest a zip can say), so that the same arrays give the same bytes.
#include <zip.h>

#include <ctime>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv {
namespace {

constexpr const char* kSubject = "npz";

// Owns the libzip error and buffer source until the bytes are out.
struct ZipBuffer {
  zip_error_t error{};
  zip_source_t* source = nullptr;
  ZipBuffer() { zip_error_init(&error); }
  ~ZipBuffer() {
    if (source != nullptr) zip_source_free(source);
    zip_error_fini(&error);
  }
  ZipBuffer(const ZipBuffer&) = delete;
  ZipBuffer& operator=(const ZipBuffer&) = delete;
};

[[noreturn]] void fail(zip_error_t* error, const std::string& doing) {
  throw Error(kSubject, doing + ": " + zip_error_strerror(error));
}

}  // namespace

std::vector<char> encode_npz(const std::vector<std::pair<std::string, TensorView>>& arrays,
                             DType dtype) {
  std::set<std::string> seen;
  std::vector<std::vector<char>> members;  // alive until zip_close has read them
  members.reserve(arrays.size());
  for (const auto& [name, view] : arrays) {
    if (name.empty() || name == "." || name == ".." ||
        name.find_first_of("/\\") != std::string::npos || name.find('\0') != std::string::npos) {
      throw Error(kSubject, "an array cannot be named \"" + name + "\"");
    }
    if (!seen.insert(name).second) throw Error(name, "is given twice for one .npz file");
    members.push_back(encode_npy(view, dtype));
  }

  ZipBuffer buffer;
  buffer.source = zip_source_buffer_create(nullptr, 0, 0, &buffer.error);
  if (buffer.source == nullptr) fail(&buffer.error, "cannot start the archive");
  zip_t* zip = zip_open_from_source(buffer.source, ZIP_TRUNCATE, &buffer.error);
  if (zip == nullptr) fail(&buffer.error, "cannot start the archive");
  zip_source_keep(buffer.source);  // zip_close would free it; its bytes are read after
  const time_t kEarliestZipTime = 315532800;  // 1980-01-01 00:00:00 UTC
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    const std::string member = arrays[i].first + ".npy";
    zip_source_t* data =
        zip_source_buffer(zip, members[i].data(), members[i].size(), /*freep=*/0);
    const zip_int64_t index =
        data == nullptr ? -1 : zip_file_add(zip, member.c_str(), data, ZIP_FL_ENC_UTF_8);
    if (index < 0 ||
        zip_set_file_compression(zip, static_cast<zip_uint64_t>(index), ZIP_CM_STORE, 0) != 0 ||
        zip_file_set_mtime(zip, static_cast<zip_uint64_t>(index), kEarliestZipTime, 0) != 0) {
      if (data != nullptr && index < 0) zip_source_free(data);
      const std::string why = zip_strerror(zip);
      zip_discard(zip);
      throw Error(kSubject, "cannot add " + member + ": " + why);
    }
  }
  if (zip_close(zip) != 0) {
    const std::string why = zip_strerror(zip);
    zip_discard(zip);
    throw Error(kSubject, "cannot finish the archive: " + why);
  }

  zip_stat_t stat;
  zip_stat_init(&stat);
  if (zip_source_stat(buffer.source, &stat) != 0 || (stat.valid & ZIP_STAT_SIZE) == 0) {
    fail(zip_source_error(buffer.source), "cannot measure the archive");
  }
  std::vector<char> bytes(static_cast<std::size_t>(stat.size));
  if (zip_source_open(buffer.source) != 0) fail(zip_source_error(buffer.source), "cannot read it");
  const zip_int64_t got = zip_source_read(buffer.source, bytes.data(), bytes.size());
  zip_source_close(buffer.source);
  if (got < 0 || static_cast<std::uint64_t>(got) != stat.size) {
    throw Error(kSubject, "cannot read the archive back from memory");
  }
  return bytes;
}

}  // namespace qkv
