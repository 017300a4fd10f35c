// Writes .npz archives for the tests through libzip, as np.savez (stored members) and
// np.savez_compressed (deflated members) lay them out: one NAME.npy member per array.
#pragma once

#include <zip.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace qkv::testing {

struct NpzMember {
  std::string name;  // the member's name, ".npy" included
  std::vector<char> bytes;
  bool deflate = false;
};

inline void write_npz(const std::filesystem::path& path, const std::vector<NpzMember>& members) {
  int code = 0;
  zip_t* zip = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &code);
  if (zip == nullptr) throw std::runtime_error("write_npz: cannot create " + path.string());
  for (const NpzMember& member : members) {
    // The bytes stay with the caller until zip_close reads them (freep = 0).
    zip_source_t* source = zip_source_buffer(zip, member.bytes.data(), member.bytes.size(), 0);
    const zip_int64_t index =
        source == nullptr ? -1 : zip_file_add(zip, member.name.c_str(), source, ZIP_FL_ENC_UTF_8);
    if (index < 0 ||
        zip_set_file_compression(zip, static_cast<zip_uint64_t>(index),
                                 member.deflate ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0) != 0) {
      if (index < 0 && source != nullptr) zip_source_free(source);
      zip_discard(zip);
      throw std::runtime_error("write_npz: cannot add " + member.name);
    }
  }
  if (zip_close(zip) != 0) {
    zip_discard(zip);
    throw std::runtime_error("write_npz: cannot write " + path.string());
  }
}

}  // namespace qkv::testing
