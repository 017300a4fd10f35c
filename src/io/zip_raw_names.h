// The member names of a zip archive as its central directory spells them, byte for byte.
//
// libzip hands names as C strings with every NUL byte turned into a space, while Python's
// zipfile (and so np.load) cuts a name at its first NUL: 'q.npy\0zz' is 'q.npy zz' to libzip and
// 'q.npy' to NumPy. Only these raw bytes tell such a name from one with a real space.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/input_file.h"

namespace qkv::io {

// Reads the central directory the end record (or the zip64 end record) points to and returns
// `entries` raw names in its order, or an empty vector when the directory cannot be walked
// that way (the caller then refuses: libzip read it, so it is not an archive np.savez wrote).
std::vector<std::string> zip_raw_names(const InputFile& file, std::uint64_t entries);

}  // namespace qkv::io
