#pragma once
// Runs the ekva binary built with the tests and captures its exit code and output.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace ekva::testing {

struct CommandResult {
  int code;         // exit status; -1 when the process did not exit normally
  std::string out;  // stdout and stderr together
};

inline CommandResult run_ekva(const std::string& args) {
  const std::string cmd = std::string(EKVA_BINARY) + " " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace ekva::testing
