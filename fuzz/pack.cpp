// Every fuzz target in one binary: one copy of the library, the sanitizers and libFuzzer instead of
// one per target, which is also what lets scripts/fuzz-pack.sh's pack travel with the working tree
// to a machine with more cores. It runs the target that EKVA_FUZZ_TARGET names or, without it, the
// one its own name says (fuzz_NAME, a link to it).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "fuzz/targets.h"

namespace {

ekva::fuzz::Target target = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  std::string name;
  if (const char* env = std::getenv("EKVA_FUZZ_TARGET"); env != nullptr && *env != '\0') {
    name = env;
  } else if (*argc > 0) {
    name = std::filesystem::path((*argv)[0]).filename().string();
    if (name.rfind("fuzz_", 0) == 0) name.erase(0, 5);
  }
  const auto it = ekva::fuzz::targets().find(name);
  if (it == ekva::fuzz::targets().end()) {
    std::fprintf(stderr,
                 "ekva_fuzz: no target '%s'; name one in EKVA_FUZZ_TARGET or run it as "
                 "fuzz_NAME, NAME one of:",
                 name.c_str());
    for (const auto& [known, _] : ekva::fuzz::targets()) std::fprintf(stderr, " %s", known.c_str());
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  target = it->second;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ekva::fuzz::run(target, data, size);
  return 0;
}
