#pragma once
// The project's one error type. Library code throws ekva::Error; only the CLI catches and reports
// it.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace ekva {

enum class ErrorKind {
  kInvalidArgument,  // a value given by the caller is out of range or inconsistent
  kInvalidFile,      // a file exists but its content is malformed
  kNotFound,         // a file, tensor or field is missing
  kUnsupported,      // well-formed input that EKVA does not implement (architecture, dtype, ...)
  kOutOfMemory,      // an allocation or a budget cannot be met
  kIo,               // the operating system refused a read, write or map
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(kind, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace ekva
