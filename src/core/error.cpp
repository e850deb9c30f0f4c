#include "core/error.h"

namespace ekva {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "invalid argument";
    case ErrorKind::kInvalidFile:
      return "invalid file";
    case ErrorKind::kNotFound:
      return "not found";
    case ErrorKind::kUnsupported:
      return "unsupported";
    case ErrorKind::kOutOfMemory:
      return "out of memory";
    case ErrorKind::kIo:
      return "i/o error";
  }
  return "error";
}

}  // namespace ekva
