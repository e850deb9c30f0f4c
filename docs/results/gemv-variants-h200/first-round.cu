// Scratch microbenchmark (not part of the project): GEMV weight-streaming variants.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CK(x)                                                          \
  do {                                                                 \
    cudaError_t e = (x);                                               \
    if (e != cudaSuccess) {                                            \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

__device__ __forceinline__ float2 unpack(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
__device__ __forceinline__ float dot8(uint4 w, uint4 x, float acc) {
  const uint32_t wv[4] = {w.x, w.y, w.z, w.w}, xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 a = unpack(wv[i]), b = unpack(xv[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}
struct Shape {
  const uint16_t* w;
  const uint16_t* x;
  float* y;
  int rows;
  int K;
};

__global__ void ref_kernel(Shape s) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= s.rows) return;
  float acc = 0;
  const uint4* w = (const uint4*)(s.w + (int64_t)r * s.K);
  const uint4* x = (const uint4*)s.x;
  for (int v = 0; v < s.K / 8; ++v) acc = dot8(w[v], x[v], acc);
  s.y[r] = acc;
}

template <int R, int D>
__global__ void __launch_bounds__(256) reg_kernel(Shape s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * 8 + warp) * R;
  const int vectors = s.K / 8;
  const uint4* x = (const uint4*)s.x;
  const uint4* rows[R];
  for (int k = 0; k < R; ++k)
    rows[k] = (const uint4*)(s.w + (int64_t)min(row0 + k, s.rows - 1) * s.K);
  float acc[R] = {};
  for (int base = lane; base < vectors; base += 32 * D) {
    uint4 wv[D][R], xv[D];
#pragma unroll
    for (int d = 0; d < D; ++d) {
      int v = base + 32 * d;
      bool ok = v < vectors;
      xv[d] = ok ? __ldg(x + v) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int k = 0; k < R; ++k) wv[d][k] = ok ? __ldcs(rows[k] + v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int d = 0; d < D; ++d)
#pragma unroll
      for (int k = 0; k < R; ++k) acc[k] = dot8(wv[d][k], xv[d], acc[k]);
  }
#pragma unroll
  for (int k = 0; k < R; ++k)
    for (int o = 16; o > 0; o /= 2) acc[k] += __shfl_xor_sync(~0u, acc[k], o);
  if (lane < R && row0 + lane < s.rows) {
    float v = acc[0];
#pragma unroll
    for (int k = 1; k < R; ++k)
      if (lane == k) v = acc[k];
    s.y[row0 + lane] = v;
  }
}

__device__ __forceinline__ uint32_t sa(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint64_t* b, int n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(n));
}
__device__ __forceinline__ void mbar_expect(uint64_t* b, uint32_t tx) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(b)), "r"(tx)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, int parity) {
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra "
      "W;\n}" ::"r"(sa(b)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                          uint64_t pol) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], %2, [%3], %4;" ::"r"(sa(dst)),
      "l"(src), "r"(bytes), "r"(sa(bar)), "l"(pol)
      : "memory");
}

template <int kStageBytes, int kStages, int kConsumers>
__global__ void __launch_bounds__((kConsumers + 1) * 32) stream_kernel(Shape s) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = (uint64_t*)smem;
  uint64_t* empty = full + kStages;
  float* part = (float*)(empty + kStages);  // [2][256]
  uint16_t* xs = (uint16_t*)(part + 512);
  unsigned char* stages = smem + 128 + 2048 + ((s.K * 2 + 127) / 128) * 128;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_bytes = s.K * 2;
  const int rps = kStageBytes / row_bytes;
  const int slices = rps >= kConsumers ? 1 : kConsumers / rps;
  const int r_begin = (int)((int64_t)blockIdx.x * s.rows / gridDim.x),
            r_end = (int)((int64_t)(blockIdx.x + 1) * s.rows / gridDim.x);
  const int n_st = (r_end - r_begin + rps - 1) / rps;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(full + i, 1);
      mbar_init(empty + i, 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == kConsumers) {
    if (lane == 0) {
      uint64_t pol;
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
      for (int i = 0; i < n_st; ++i) {
        const int st = i % kStages;
        if (i >= kStages) mbar_wait(empty + st, ((i / kStages) - 1) & 1);
        const int r0 = r_begin + i * rps, nr = min(rps, r_end - r0);
        mbar_expect(full + st, nr * row_bytes);
        bulk_copy(stages + st * kStageBytes, s.w + (int64_t)r0 * s.K, nr * row_bytes, full + st,
                  pol);
      }
    }
    return;
  }
  for (int v = threadIdx.x; v < s.K / 8; v += kConsumers * 32)
    ((uint4*)xs)[v] = ((const uint4*)s.x)[v];
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32));
  const int vectors = s.K / 8;
  for (int i = 0; i < n_st; ++i) {
    const int st = i % kStages;
    mbar_wait(full + st, (i / kStages) & 1);
    const int r0 = r_begin + i * rps, nr = min(rps, r_end - r0);
    const uint4* tile = (const uint4*)(stages + st * kStageBytes);
    float* pp = part + (i & 1) * 256;
    for (int u = warp; u < nr * slices; u += kConsumers) {
      const int row = u / slices, sl = u % slices;
      const uint4* wr = tile + row * vectors;
      const int b = sl * vectors / slices, e = (sl + 1) * vectors / slices;
      float acc = 0;
      for (int v = b + lane; v < e; v += 32) acc = dot8(wr[v], ((const uint4*)xs)[v], acc);
      for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(~0u, acc, o);
      if (lane == 0) pp[u] = acc;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32));
    if (threadIdx.x == 0) mbar_arrive(empty + st);
    if (threadIdx.x < nr) {
      float v = 0;
      for (int q = 0; q < slices; ++q) v += pp[threadIdx.x * slices + q];
      s.y[r0 + threadIdx.x] = v;
    }
  }
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t pool_bytes = size_t(1) << 30;
  uint16_t* pool;
  CK(cudaMalloc(&pool, pool_bytes + (1 << 20)));
  {
    std::vector<uint16_t> h(1 << 22);
    for (size_t i = 0; i < h.size(); ++i) h[i] = 0x3c00 + (rand() % 512) - 256;
    for (size_t off = 0; off < pool_bytes / 2; off += h.size())
      CK(cudaMemcpy(pool + off, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  }
  uint16_t* x;
  CK(cudaMalloc(&x, 65536 * 2));
  {
    std::vector<uint16_t> h(65536);
    for (auto& v : h) v = 0x3c00 + (rand() % 512) - 256;
    CK(cudaMemcpy(x, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  }
  float *y, *yref;
  CK(cudaMalloc(&y, 1 << 22));
  CK(cudaMalloc(&yref, 1 << 22));
  struct S {
    const char* name;
    int rows, K;
  } shapes[] = {{"mixtral gate_up 2x", 57344, 4096}, {"mixtral down 2x", 8192, 14336},
                {"mixtral qkv", 6144, 4096},         {"mixtral o", 4096, 4096},
                {"qwen3 gate_up 8x", 12288, 2048},   {"qwen3 down 8x", 16384, 768},
                {"qwen3 qkv", 5120, 2048},           {"qwen3 o", 2048, 4096},
                {"qwen3 lmhead", 151936, 2048}};
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (auto& sh : shapes) {
    const size_t bytes = size_t(sh.rows) * sh.K * 2;
    const int copies = std::max<size_t>(1, pool_bytes / bytes);
    auto run = [&](const char* vname, auto launch) {
      Shape s{pool, x, y, sh.rows, sh.K};
      CK(cudaMemset(y, 0, sh.rows * 4));
      launch(s);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      Shape r{pool, x, yref, sh.rows, sh.K};
      ref_kernel<<<(sh.rows + 127) / 128, 128>>>(r);
      CK(cudaDeviceSynchronize());
      std::vector<float> h1(sh.rows), h2(sh.rows);
      CK(cudaMemcpy(h1.data(), y, sh.rows * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(h2.data(), yref, sh.rows * 4, cudaMemcpyDeviceToHost));
      double err = 0;
      for (int i = 0; i < sh.rows; ++i)
        err = std::max(err, (double)fabs(h1[i] - h2[i]) / (1e-3 + fabs(h2[i])));
      const int reps = 30;
      for (int i = 0; i < 3; ++i) {
        Shape t = s;
        t.w = pool + (size_t(i % copies) * bytes) / 2;
        launch(t);
      }
      CK(cudaEventRecord(a));
      for (int i = 0; i < reps; ++i) {
        Shape t = s;
        t.w = pool + (size_t(i % copies) * bytes) / 2;
        launch(t);
      }
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      const double us = ms * 1000 / reps;
      printf("%-20s %-28s %8.2f us %6.2f TB/s  relerr %.1e\n", sh.name, vname, us, bytes / us / 1e6,
             err);
    };
    run("reg R4 D2", [&](Shape s) { reg_kernel<4, 2><<<(s.rows + 31) / 32, 256>>>(s); });
    run("reg R2 D4", [&](Shape s) { reg_kernel<2, 4><<<(s.rows + 15) / 16, 256>>>(s); });
    run("reg R4 D4", [&](Shape s) { reg_kernel<4, 4><<<(s.rows + 31) / 32, 256>>>(s); });
    run("reg R1 D8", [&](Shape s) { reg_kernel<1, 8><<<(s.rows + 7) / 8, 256>>>(s); });
    auto stream = [&](auto kern, int stage_bytes, int stages, int per_sm, const char* n) {
      if (sh.K * 2 > stage_bytes) return;
      const int smem = 128 + 2048 + ((sh.K * 2 + 127) / 128) * 128 + stage_bytes * stages;
      CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      run(n,
          [&](Shape s) { kern<<<std::min(sms * per_sm, (sh.rows + 1) / 2), 9 * 32, smem>>>(s); });
    };
    stream(stream_kernel<32768, 6, 8>, 32768, 6, 1, "bulk 32K x6, 1/SM");
    stream(stream_kernel<32768, 3, 8>, 32768, 3, 2, "bulk 32K x3, 2/SM");
    stream(stream_kernel<16384, 12, 8>, 16384, 12, 1, "bulk 16K x12, 1/SM");
    stream(stream_kernel<16384, 6, 8>, 16384, 6, 2, "bulk 16K x6, 2/SM");
    stream(stream_kernel<65536, 3, 8>, 65536, 3, 1, "bulk 64K x3, 1/SM");
    stream(stream_kernel<8192, 8, 8>, 8192, 8, 2, "bulk 8K x8, 2/SM");
  }
  return 0;
}
