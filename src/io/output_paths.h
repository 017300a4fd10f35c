// Where an output goes: its destination resolved and checked when it is staged, so that a
// commit fails only if the file system changes under it (output_paths.cc).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>

namespace qkv::io {

struct OutputTarget {
  // The file to replace: the destination itself, or the regular file its symbolic link names
  // (so that the link stays a link); the temporary file is made beside it.
  std::filesystem::path path;
  std::filesystem::path directory;  // path's folder ("." for a bare name)
  dev_t directory_device = 0;       // the folder's identity, for comparing outputs and locking
  ino_t directory_inode = 0;
  bool exists = false;  // a regular file is there now, to be replaced
};

// Resolves `destination` and checks everything that would make its final rename fail or do
// harm: a name or path too long for its folder (pathconf), a folder that is missing, not a
// folder, not writable and searchable, or sticky with another user's file in it; a destination
// that is a directory, not a regular file (a FIFO or a device, directly or through a symbolic
// link such as /proc/self/fd/N: refused, never replaced), or a dangling symbolic link (refused:
// writing through it would create a file wherever it points). Throws qkv::Error with `subject`.
OutputTarget resolve_output(const std::filesystem::path& destination, const std::string& subject);

// Whether two resolved outputs are one file, however they were spelled: the same name in the
// same folder, the folder compared by device and inode, so "o.npy", "./o.npy", "$PWD/o.npy",
// "a/../o.npy", a symlinked folder, a bind mount and (resolved when staged) a symbolic link to
// the other output all match. Not the file's own device and inode: while another run replaces
// the files, a freed inode number is soon given to a new file, so two different outputs staged
// a moment apart can show the same number (a test with concurrent writers saw it happen).
bool same_output(const OutputTarget& a, const OutputTarget& b);

}  // namespace qkv::io
