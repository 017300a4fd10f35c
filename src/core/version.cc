#include "qkv/error.h"

namespace qkv {

const char* version() noexcept { return QKV_VERSION_STRING; }

}  // namespace qkv
