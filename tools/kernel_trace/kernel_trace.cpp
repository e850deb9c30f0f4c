// A CUDA injection library that records when every kernel ran, inside CUDA graphs too, with CUPTI's
// activity API, and writes one CSV row per kernel when the process exits:
//
//   CUDA_INJECTION64_PATH=libekva_kernel_trace.so EKVA_KERNEL_TRACE=trace.csv ekva bench ...
//   tools/kernel_trace_summary.py trace.csv --layers 48
//
// Nsight Compute times each kernel alone; a decode step is one graph whose launches overlap
// (programmatic dependent launch), so only the timeline says which kernels the step waits on.
// Nsight Systems cannot make its report on the GPU machine (.library/device/KINDS.md).
#include <cupti.h>
#include <cxxabi.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct KernelRecord {
  uint64_t start, end;
  uint32_t graph_id;
  uint64_t graph_node_id;
  uint32_t stream_id;
  int32_t grid[3], block[3];
  std::string name;
};

std::mutex records_mutex;
std::vector<KernelRecord> records;
std::FILE* trace_file = nullptr;  // opened when the library loads, so a bad path fails at once
const char* trace_path = nullptr;
constexpr size_t kBufferBytes = 8 << 20;

void check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, text != nullptr ? text : "?");
  std::exit(2);
}

std::string demangled(const char* name) {
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string text = status == 0 && plain != nullptr ? plain : name;
  std::free(plain);
  for (char& c : text) {
    if (c == ',' || c == '"') c = ';';  // one CSV field
  }
  return text;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;  // none: CUPTI drops the records
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard lock(records_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    records.push_back({k->start,
                       k->end,
                       k->graphId,
                       k->graphNodeId,
                       k->streamId,
                       {k->gridX, k->gridY, k->gridZ},
                       {k->blockX, k->blockY, k->blockZ},
                       demangled(k->name)});
  }
  std::free(buffer);
}

void write_trace() {
  cuptiActivityFlushAll(1);
  std::fprintf(trace_file, "start_ns,end_ns,graph_id,graph_node_id,stream_id,grid,block,name\n");
  std::lock_guard lock(records_mutex);
  for (const KernelRecord& r : records) {
    std::fprintf(trace_file, "%llu,%llu,%u,%llu,%u,%dx%dx%d,%dx%dx%d,%s\n",
                 static_cast<unsigned long long>(r.start), static_cast<unsigned long long>(r.end),
                 r.graph_id, static_cast<unsigned long long>(r.graph_node_id), r.stream_id,
                 r.grid[0], r.grid[1], r.grid[2], r.block[0], r.block[1], r.block[2],
                 r.name.c_str());
  }
  std::fclose(trace_file);
  std::fprintf(stderr, "kernel_trace: %zu kernels written to %s\n", records.size(), trace_path);
}

}  // namespace

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  trace_path = std::getenv("EKVA_KERNEL_TRACE");
  if (trace_path == nullptr) {
    std::fprintf(stderr, "kernel_trace: set EKVA_KERNEL_TRACE to the CSV file to write\n");
    std::exit(2);
  }
  trace_file = std::fopen(trace_path, "w");
  if (trace_file == nullptr) {
    std::fprintf(stderr, "kernel_trace: cannot write %s: %s\n", trace_path, std::strerror(errno));
    std::exit(2);
  }
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
        "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  std::atexit(write_trace);
  return 1;
}
