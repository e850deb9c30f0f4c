#pragma once
// The kernels of cuda_product_chain_bench (product_chain_bench.cpp says what it measures): a
// chain of one-row products y = W x, each product's input row being the first in_cols outputs of
// the product before, run as one kernel per product or as one persistent kernel.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ekva::cuda {

// A warp takes a row at a time, kChainChunk columns (4 KB of weights, eight 16-byte loads a lane)
// a step, the next step's weights loaded while it multiplies the current one, as the engine's
// one-token products do; every form adds in the same order and writes bf16 outputs, so that their
// outputs are bit-identical.
inline constexpr int kChainChunk = 2048;

struct ChainProduct {
  const uint16_t* w = nullptr;  // bf16 [rows, in_cols]
  const uint16_t* x = nullptr;  // bf16 input row (the product before's y, or the chain's input)
  uint16_t* y = nullptr;        // bf16 [rows]
  int rows = 0, in_cols = 0, chunks = 0;
  int first_warp = 0;  // the persistent grid's warp that takes row 0 (round robin over products)
  // The product whose outputs say which weights this one reads (a router's, for the experts'
  // products), so that no form loads them before it is complete; -1: none.
  int after = -1;
};

// Uniform bf16 in [-a, a), a function of (seed, index).
void fill_chain_weights(uint16_t* w, int64_t count, uint32_t seed, float a, cudaStream_t stream);
// One product: a warp per row, its weights loaded before it waits for the kernel before
// (programmatic dependent launch).
void launch_chain_product(const ChainProduct& p, cudaStream_t stream);
// The persistent grid (CTAs) for products of at most max_in_cols columns, and its warps.
int chain_grid(int max_in_cols);
int chain_warps(int grid);
// All products in one kernel of chain_grid(max_in_cols) CTAs; counts: [num_products] zero.
void launch_chain(const ChainProduct* products, int num_products, int max_in_cols, int grid,
                  int* counts, cudaStream_t stream);

// The same with each warp's next steps copied into shared memory ahead by a copying warp (one CTA
// a multiprocessor; 0 when the rings and a row of max_in_cols do not fit); its warps take rows
// round robin as the register form's do, so products' first_warp must be set for
// staged_chain_warps(grid).
int staged_chain_grid(int max_in_cols);
int staged_chain_warps(int grid);
void launch_staged_chain(const ChainProduct* products, int num_products, int max_in_cols, int grid,
                         int* counts, cudaStream_t stream);

}  // namespace ekva::cuda
