// Times a batch-1 step's chain of one-row products (each layer's Q/K/V, O, router, experts'
// gate-and-up and down products as dense matrices of the same bytes, a product's input row being
// the first in_cols outputs of the one before, or O's for the router and gate-and-up; the
// experts' weights are not read before the router is complete) three ways on the same weights:
//   launched:   one kernel per product in a CUDA graph, each launched with programmatic dependent
//               launch and loading its weights before it waits for the kernel before (the
//               engine's one-token products do the same);
//   persistent: one kernel for the whole chain, whose warps hold the weights of their next step
//               in registers while the products before finish, waiting on a per-product count
//               only before they read the input row;
//   staged:     the same with each warp's next five steps copied into shared memory ahead by a
//               copying warp, which keeps copying while the multiplying warps wait.
// The question it answers: how much of a batch-1 step's distance from the bandwidth floor is the
// products' own starts and ends at kernel boundaries (docs/BENCHMARKS.md, sessions 40 and 41).
// Norms, attention and the routing's arithmetic are left out: the chain is the products alone.
//
//   cuda_product_chain_bench [--model qwen3|olmoe|mixtral] [--layers N] [--reps N]
// Prints one JSON line; exits 1 unless all forms' last outputs are equal and finite.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "product_chain.h"

namespace ekva::cuda {
namespace {

struct Shape {
  int out_rows, in_cols;
  int input_back = 1;   // the product whose outputs are the input row: 1 the one before, 2 ...
  bool routed = false;  // its weights wait for the layer's router (the product router_back before)
  int router_back = 0;
};

// A layer's products: Q/K/V, O, the router (on O's outputs), the routed experts' gate-and-up (on
// O's outputs too) and down as dense matrices of the same bytes (top-k experts' rows stacked),
// the experts' weights waiting for the router's outputs; empty for a model it does not know.
std::vector<Shape> layer_products(const std::string& model) {
  const auto layer = [](int hidden, int qkv, int q, int experts, int gate_up, int down_in) {
    return std::vector<Shape>{{qkv, hidden},
                              {hidden, q},
                              {experts, hidden},
                              {gate_up, hidden, 2, true, 1},
                              {hidden, down_in, 1, true, 2}};
  };
  if (model == "qwen3") return layer(2048, 5120, 4096, 128, 8 * 1536, 8 * 768);
  if (model == "olmoe") return layer(2048, 6144, 2048, 64, 8 * 2048, 8 * 1024);
  if (model == "mixtral") return layer(4096, 6144, 4096, 8, 2 * 28672, 2 * 14336);
  return {};
}

// A whole positive decimal int, or 0.
int positive(const char* text) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return end != text && *end == '\0' && value > 0 && value <= 1 << 20 ? static_cast<int>(value) : 0;
}

int run(int argc, char** argv) {
  std::string model = "qwen3";
  int layers = 0, reps = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") {
      std::printf(
          "cuda_product_chain_bench [--model qwen3|olmoe|mixtral] [--layers N] [--reps N]\n"
          "  --layers: the model's own count by default; --reps: timed replays (10)\n");
      return 0;
    }
    if (a != "--model" && a != "--layers" && a != "--reps") {
      std::fprintf(stderr, "unknown option %s (see --help)\n", a.c_str());
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", a.c_str());
      return 2;
    }
    const char* value = argv[++i];
    if (a == "--model") {
      model = value;
      continue;
    }
    const int number = positive(value);
    if (number == 0) {
      std::fprintf(stderr, "%s takes a positive whole number, not '%s'\n", a.c_str(), value);
      return 2;
    }
    (a == "--layers" ? layers : reps) = number;
  }
  const std::vector<Shape> layer = layer_products(model);
  if (layer.empty()) {
    std::fprintf(stderr, "unknown --model %s (qwen3, olmoe or mixtral)\n", model.c_str());
    return 2;
  }
  if (layers == 0) layers = model == "mixtral" ? 32 : model == "olmoe" ? 16 : 48;

  std::vector<Shape> shapes;
  for (int l = 0; l < layers; ++l) shapes.insert(shapes.end(), layer.begin(), layer.end());
  const int n = static_cast<int>(shapes.size());
  int max_in = 0;
  for (const Shape& s : shapes) max_in = std::max(max_in, s.in_cols);
  const int grid = chain_grid(max_in);
  if (grid < 1) {
    std::fprintf(stderr, "the chain kernel does not fit a multiprocessor\n");
    return 1;
  }
  const int total_warps = chain_warps(grid);

  std::vector<DeviceBuffer<uint16_t>> weights;
  std::vector<DeviceBuffer<uint16_t>> outputs;
  DeviceBuffer<uint16_t> input(static_cast<size_t>(shapes[0].in_cols));
  fill_chain_weights(input.data(), static_cast<int64_t>(input.size()), 1, 1.0f, nullptr);
  std::vector<ChainProduct> products(n);
  double bytes = 0;
  int warp_cursor = 0;
  for (int i = 0; i < n; ++i) {
    const Shape& s = shapes[i];
    ChainProduct& p = products[i];
    const int source = i - s.input_back;
    if (i > 0 && (source < 0 || s.in_cols > products[source].rows)) {
      std::fprintf(stderr, "product %d takes %d inputs of product %d's\n", i, s.in_cols, source);
      return 1;
    }
    p.rows = s.out_rows;
    p.in_cols = s.in_cols;
    p.chunks = (s.in_cols + kChainChunk - 1) / kChainChunk;
    weights.emplace_back(static_cast<size_t>(s.out_rows) * s.in_cols);
    // Uniform in +-sqrt(3 / in_cols): each output keeps its input's variance.
    fill_chain_weights(weights.back().data(), static_cast<int64_t>(weights.back().size()),
                       0x9e3779b9u * (i + 1), std::sqrt(3.0f / s.in_cols), nullptr);
    outputs.emplace_back(static_cast<size_t>(p.rows));
    p.w = weights.back().data();
    p.y = outputs.back().data();
    p.x = i == 0 ? input.data() : products[source].y;
    p.after = s.routed ? i - s.router_back : -1;
    p.first_warp = warp_cursor;
    warp_cursor = (warp_cursor + p.rows) % total_warps;
    bytes += static_cast<double>(s.out_rows) * s.in_cols * sizeof(uint16_t);
  }
  DeviceBuffer<ChainProduct> products_d{std::span<const ChainProduct>(products)};
  // The staged grid has its own number of warps to take the rows round robin.
  const int staged_grid = staged_chain_grid(max_in);
  if (staged_grid < 1) {
    std::fprintf(stderr, "the staged chain kernel does not fit a multiprocessor\n");
    return 1;
  }
  std::vector<ChainProduct> staged_products = products;
  for (int i = 0, cursor = 0; i < n; ++i) {
    staged_products[i].first_warp = cursor;
    cursor = (cursor + staged_products[i].rows) % staged_chain_warps(staged_grid);
  }
  DeviceBuffer<ChainProduct> staged_d{std::span<const ChainProduct>(staged_products)};
  DeviceBuffer<int> counts(static_cast<size_t>(n));

  cudaStream_t stream;
  EKVA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto capture = [&](auto body) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    EKVA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    body();
    EKVA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    EKVA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    EKVA_CUDA_CHECK(cudaGraphDestroy(graph));
    return exec;
  };
  cudaGraphExec_t launched = capture([&] {
    for (const ChainProduct& p : products) launch_chain_product(p, stream);
  });
  cudaGraphExec_t persistent = capture([&] {
    EKVA_CUDA_CHECK(cudaMemsetAsync(counts.data(), 0, counts.bytes(), stream));
    launch_chain(products_d.data(), n, max_in, grid, counts.data(), stream);
  });
  cudaGraphExec_t staged = capture([&] {
    EKVA_CUDA_CHECK(cudaMemsetAsync(counts.data(), 0, counts.bytes(), stream));
    launch_staged_chain(staged_d.data(), n, max_in, staged_grid, counts.data(), stream);
  });
  cudaEvent_t start, stop;
  EKVA_CUDA_CHECK(cudaEventCreate(&start));
  EKVA_CUDA_CHECK(cudaEventCreate(&stop));
  const auto median_ms = [&](cudaGraphExec_t exec) {
    for (int i = 0; i < 3; ++i) EKVA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    std::vector<float> ms(reps);
    for (float& t : ms) {
      EKVA_CUDA_CHECK(cudaEventRecord(start, stream));
      EKVA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      EKVA_CUDA_CHECK(cudaEventRecord(stop, stream));
      EKVA_CUDA_CHECK(cudaEventSynchronize(stop));
      EKVA_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    }
    std::sort(ms.begin(), ms.end());
    return static_cast<double>(ms[ms.size() / 2]);
  };
  const double launched_ms = median_ms(launched);
  const std::vector<uint16_t> launched_out = outputs.back().download();
  const double persistent_ms = median_ms(persistent);
  const std::vector<uint16_t> persistent_out = outputs.back().download();
  const double staged_ms = median_ms(staged);
  const std::vector<uint16_t> staged_out = outputs.back().download();
  const bool equal = persistent_out == launched_out && staged_out == launched_out;
  bool finite = true;
  for (uint16_t v : launched_out) {
    finite = finite && (v & 0x7f80) != 0x7f80;  // bf16 exponent all ones: inf or NaN
  }
  const auto tbps = [&](double ms) { return bytes / ms / 1e9; };
  std::printf(
      "{\"model\": \"%s\", \"layers\": %d, \"products\": %d, \"weight_bytes\": %.0f, "
      "\"launched_ms\": %.4f, \"persistent_ms\": %.4f, \"staged_ms\": %.4f, "
      "\"launched_tbps\": %.3f, \"persistent_tbps\": %.3f, \"staged_tbps\": %.3f, "
      "\"outputs_equal\": %s, \"outputs_finite\": %s}\n",
      model.c_str(), layers, n, bytes, launched_ms, persistent_ms, staged_ms, tbps(launched_ms),
      tbps(persistent_ms), tbps(staged_ms), equal ? "true" : "false", finite ? "true" : "false");
  EKVA_CUDA_CHECK(cudaGraphExecDestroy(launched));
  EKVA_CUDA_CHECK(cudaGraphExecDestroy(persistent));
  EKVA_CUDA_CHECK(cudaGraphExecDestroy(staged));
  EKVA_CUDA_CHECK(cudaStreamDestroy(stream));
  return equal && finite ? 0 : 1;
}

}  // namespace
}  // namespace ekva::cuda

int main(int argc, char** argv) {
  try {
    return ekva::cuda::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_product_chain_bench: %s\n", e.what());
    return 1;
  }
}
