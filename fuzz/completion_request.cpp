#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ekva::fuzz::run(ekva::fuzz::completion_request, data, size);
  return 0;
}
