#pragma once
// Small helpers shared by the CUDA kernels: async copies, ldmatrix and the bf16 tensor-core
// product, written out in PTX so that the data movement is explicit, and the overlapping launch.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"

namespace ekva::cuda {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// An L2 cache policy under which the lines it tags are evicted first.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// Starts reading [src, src + bytes) from DRAM into L2 without waiting for it (src and bytes
// multiples of 16). L2 is where all multiprocessors' writes meet, so a line prefetched before
// another kernel writes it is never read stale.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// Programmatic dependent launch. A kernel launched with programmatic stream serialization may
// start while the kernel before it in the stream is still running, once every CTA of that kernel
// has allowed it (or exited); it must wait before it reads or writes anything that kernel touches.
// Without the launch attribute, on either side, both are no-ops.
__device__ __forceinline__ void allow_next_grid() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
}
__device__ __forceinline__ void wait_for_prior_grid() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// Adds 1 to a counter other CTAs also count on and returns its old value; acquire and release at
// GPU scope. After a CTA barrier, one thread's call publishes what the whole CTA wrote before the
// barrier and, by the next barrier, makes visible to the CTA what the CTAs counted before it wrote
// (the release and acquire are cumulative), so no thread needs a fence of its own.
__device__ __forceinline__ int count_in(int* counter) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n"
               : "=r"(old)
               : "l"(counter)
               : "memory");
  return old;
}

// The opening of a kernel launched with launch_overlapping that needs nothing before the kernel
// before it completes: wait for that kernel, then let the next one start, so that a launch
// overlaps the run of one kernel before it and never more. Every overlapping kernel waits before
// it exits, else a kernel two launches on could start while the first still runs.
__device__ __forceinline__ void follow_prior_grid() {
  wait_for_prior_grid();
  allow_next_grid();
}

// Launches `kernel` with programmatic stream serialization, so that it may start while the kernel
// before it finishes (it calls wait_for_prior_grid before touching what that kernel touches).
template <typename... Params, typename... Args>
void launch_overlapping(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                        cudaStream_t stream, const Args&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args));
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = 1;
  EKVA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

// 16-byte global->shared copy that bypasses L1, under an L2 cache policy; when !valid it writes
// zeros and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid,
                                            uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(valid ? 16 : 0), "l"(policy));
}
// The same without a cache policy, for data that other CTAs read again.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::);
}

// A warpgroup that only copies gives registers to those that multiply (setmaxnreg: the
// counts are per thread, multiples of 8, and the CTA's total stays what it launched with).
template <int Registers>
__device__ __forceinline__ void registers_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Registers));
}
template <int Registers>
__device__ __forceinline__ void registers_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Registers));
}

// Shared-memory barriers between a copying warpgroup and those that multiply (a stage full, a
// stage empty).
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives on bar once the thread's cp.async copies issued so far have landed.
__device__ __forceinline__ void mbarrier_arrive_after_copies(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      "  .reg .pred done;\n"
      "WAIT:\n"
      "  mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "  @!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Whether the phase of bar with the given parity has completed; never waits.
__device__ __forceinline__ bool mbarrier_ready(uint32_t bar, uint32_t parity) {
  uint32_t ready;
  asm volatile(
      "{\n"
      "  .reg .pred done;\n"
      "  mbarrier.test_wait.parity.shared::cta.b64 done, [%1], %2;\n"
      "  selp.u32 %0, 1, 0, done;\n"
      "}\n"
      : "=r"(ready)
      : "r"(bar), "r"(parity)
      : "memory");
  return ready != 0;
}
// Arrives on bar and adds `bytes` to the bytes its phase waits for (a bulk copy's).
__device__ __forceinline__ void mbarrier_expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Copies [src, src + bytes) into shared memory at dst (both 16-byte aligned, bytes a multiple of
// 16) and counts the bytes on bar as they land.
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t dst, const void* src, uint32_t bytes,
                                                    uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// Waits at named barrier `id` (1 to 15; 0 is __syncthreads's) for Threads threads, a multiple of
// 32: a barrier among some of a CTA's warps.
template <int Threads>
__device__ __forceinline__ void named_barrier_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(Threads) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
// Stores four 8 x 8 bf16 matrices transposed: lane 8 m + j gives the address of row j of matrix m
// in shared memory, which receives column j of the matrix whose mma fragments the lanes hold in
// r[m] (lane l: row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t address, const uint32_t (&r)[4]) {
  asm volatile(
      "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address),
      "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
      : "memory");
}

// c[16x8] += a[16x16] * b[16x8], bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Hopper's warpgroup MMA (sm_90a): the four warps of a warpgroup multiply operands that stay in
// shared memory, so no ldmatrix or fragment registers stand between the copies and the tensor
// cores. A descriptor names a K-major tile of rows of 64 bf16 (128 bytes) stored with the 128-byte
// swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)), 8-row atoms 1024 bytes apart, the tile
// 1024-byte aligned; `start` may be advanced by whole 32-byte k-steps within the row.
__device__ __forceinline__ uint64_t wgmma_descriptor(uint32_t start) {
  constexpr uint64_t kSwizzle128 = 1;
  constexpr uint64_t kAtomBytes = 1024;  // between 8-row atoms along M or N
  return static_cast<uint64_t>((start & 0x3ffff) >> 4) | (uint64_t{1} << 16) |
         ((kAtomBytes >> 4) << 32) | (kSwizzle128 << 62);
}
// The same for an N-major B operand (the MMA's transpose flag set): K rows of 64 N-elements (128
// bytes) with the 128-byte swizzle, 8-row atoms 1024 bytes apart along K and `n_block_bytes`
// between the 64-element blocks along N; `start` advances by whole 8-row atoms along K.
__device__ __forceinline__ uint64_t wgmma_descriptor_n_major(uint32_t start,
                                                             uint32_t n_block_bytes) {
  constexpr uint64_t kSwizzle128 = 1;
  constexpr uint64_t kAtomBytes = 1024;
  return static_cast<uint64_t>((start & 0x3ffff) >> 4) |
         (static_cast<uint64_t>((n_block_bytes & 0x3ffff) >> 4) << 16) | ((kAtomBytes >> 4) << 32) |
         (kSwizzle128 << 62);
}
// A descriptor's start address advanced by `bytes` (a multiple of 16; the address stays within
// shared memory, so the low word's 14-bit field does not carry): one add a product's k-step rather
// than a descriptor built again.
__device__ __forceinline__ uint64_t wgmma_descriptor_advanced(uint64_t descriptor, uint32_t bytes) {
  return (descriptor & ~uint64_t{0xffffffffu}) | (static_cast<uint32_t>(descriptor) + (bytes >> 4));
}
// Shared memory written through the generic proxy (stores, cp.async), made visible to the tensor
// cores' reads of the async proxy; each writing thread fences before the barrier.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Pins the accumulators to their registers at this point: wgmma writes them after the
// instruction that names them, so the compiler must not move or copy them across a wgmma_fence
// or a wgmma_wait.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for an A operand in registers, which the MMA reads until its wait: held live to that
// point, its registers are not given to anything else before it.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(uint32_t (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(a[i])::"memory");
}
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}
// The accumulator operands of a wgmma: d[0 .. N) with the constraint `mod` ("+f" to accumulate,
// "=f" to only write), and their place-holders in the instruction, %0 .. %(N - 1).
#define EKVA_WGMMA_D32(mod)                                                               \
  mod(d[0]), mod(d[1]), mod(d[2]), mod(d[3]), mod(d[4]), mod(d[5]), mod(d[6]), mod(d[7]), \
      mod(d[8]), mod(d[9]), mod(d[10]), mod(d[11]), mod(d[12]), mod(d[13]), mod(d[14]),   \
      mod(d[15]), mod(d[16]), mod(d[17]), mod(d[18]), mod(d[19]), mod(d[20]), mod(d[21]), \
      mod(d[22]), mod(d[23]), mod(d[24]), mod(d[25]), mod(d[26]), mod(d[27]), mod(d[28]), \
      mod(d[29]), mod(d[30]), mod(d[31])
#define EKVA_WGMMA_D64(mod)                                                                    \
  EKVA_WGMMA_D32(mod), mod(d[32]), mod(d[33]), mod(d[34]), mod(d[35]), mod(d[36]), mod(d[37]), \
      mod(d[38]), mod(d[39]), mod(d[40]), mod(d[41]), mod(d[42]), mod(d[43]), mod(d[44]),      \
      mod(d[45]), mod(d[46]), mod(d[47]), mod(d[48]), mod(d[49]), mod(d[50]), mod(d[51]),      \
      mod(d[52]), mod(d[53]), mod(d[54]), mod(d[55]), mod(d[56]), mod(d[57]), mod(d[58]),      \
      mod(d[59]), mod(d[60]), mod(d[61]), mod(d[62]), mod(d[63])
#define EKVA_WGMMA_R32                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define EKVA_WGMMA_R64                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"

// d[64 x 128] (+)= a[64 x 16] * b[16 x 128]: a and b K-major in shared memory (descriptors), bf16,
// fp32 accumulators laid out as mma_bf16_16816's over 16 column blocks of 8: warp w of the
// warpgroup holds rows 16w + lane / 4 (+ 8 for d[4i + 2], d[4i + 3]) and columns 8i + 2 (lane % 4)
// (+ 1 for the odd registers). Without Accumulate, d is only written (no zeroing before a
// product's first k-step, and d's old values need not stay live).
#define EKVA_WGMMA_M64N128K16(mod, accumulate)                                \
  asm volatile(                                                               \
      "{\n"                                                                   \
      ".reg .pred accumulate;\n"                                              \
      "setp.ne.b32 accumulate, %66, 0;\n"                                     \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " EKVA_WGMMA_R64 \
      ", %64, %65, accumulate, 1, 1, 0, 0;\n"                                 \
      "}\n"                                                                   \
      : EKVA_WGMMA_D64(mod)                                                   \
      : "l"(a), "l"(b), "r"(accumulate))
template <bool Accumulate>
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t a, uint64_t b) {
  if constexpr (Accumulate) {
    EKVA_WGMMA_M64N128K16("+f", 1);
  } else {
    EKVA_WGMMA_M64N128K16("=f", 0);
  }
}
#undef EKVA_WGMMA_M64N128K16

// d[64 x 64] (+)= a[64 x 16] * b[16 x 64], as wgmma_m64n128k16_bf16 over 8 column blocks.
#define EKVA_WGMMA_M64N64K16(mod, accumulate)                                \
  asm volatile(                                                              \
      "{\n"                                                                  \
      ".reg .pred accumulate;\n"                                             \
      "setp.ne.b32 accumulate, %34, 0;\n"                                    \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " EKVA_WGMMA_R32 \
      ", %32, %33, accumulate, 1, 1, 0, 0;\n"                                \
      "}\n"                                                                  \
      : EKVA_WGMMA_D32(mod)                                                  \
      : "l"(a), "l"(b), "r"(accumulate))
template <bool Accumulate>
__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t a, uint64_t b) {
  if constexpr (Accumulate) {
    EKVA_WGMMA_M64N64K16("+f", 1);
  } else {
    EKVA_WGMMA_M64N64K16("=f", 0);
  }
}
#undef EKVA_WGMMA_M64N64K16

// d[64 x 64] += a[64 x 16] * b[16 x 64] and d[64 x 128] += a[64 x 16] * b[16 x 128], a from
// registers (each warp its 16 rows, laid out as mma_bf16_16816's A fragment), b N-major in shared
// memory (wgmma_descriptor_n_major).
__device__ __forceinline__ void wgmma_m64n64k16_bf16_n_major(float (&d)[32], const uint32_t (&a)[4],
                                                             uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " EKVA_WGMMA_R32
      ", {%32, %33, %34, %35}, %36, accumulate, 1, 1, 1;\n"
      "}\n"
      : EKVA_WGMMA_D32("+f")
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
__device__ __forceinline__ void wgmma_m64n128k16_bf16_n_major(float (&d)[64],
                                                              const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " EKVA_WGMMA_R64
      ", {%64, %65, %66, %67}, %68, accumulate, 1, 1, 1;\n"
      "}\n"
      : EKVA_WGMMA_D64("+f")
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
#undef EKVA_WGMMA_D32
#undef EKVA_WGMMA_D64
#undef EKVA_WGMMA_R32
#undef EKVA_WGMMA_R64

// Two floats as a bf16 pair, lo in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// A bf16 as its float (exact: bf16 is the top half of a float).
__device__ __forceinline__ float bf16_bits_to_float(uint16_t x) {
  return __uint_as_float(static_cast<uint32_t>(x) << 16);
}
// A bf16 pair as written by pack_bf16.
__device__ __forceinline__ float2 unpack_bf16(uint32_t pair) {
  return make_float2(__uint_as_float(pair << 16), __uint_as_float(pair & 0xffff0000u));
}

// acc plus the dot product of eight bf16 pairs (16 bytes each), in element order.
__device__ __forceinline__ float dot8(uint4 w, uint4 x, float acc) {
  const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
  const uint32_t xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = unpack_bf16(wv[i]), b = unpack_bf16(xv[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

// 2^x as the special-function unit's one instruction. exp2f keeps subnormal results, which takes
// instructions around it; a softmax whose sum holds at least one term of 1 loses nothing to their
// flush to zero.
__device__ __forceinline__ float exp2_flush_subnormal(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint16_t to_bf16_bits(float x) {
  const __nv_bfloat16 v = __float2bfloat16_rn(x);
  return *reinterpret_cast<const uint16_t*>(&v);
}

// An RMSNorm's output element, as cpu::rms_norm forms it: one expression wherever a row is
// normalised (the norm kernel, the experts' sum that normalises the next residual), so that they
// agree bit for bit.
__device__ __forceinline__ float rms_normed(float value, float inv_rms, float weight) {
  return __fmul_rn(__fmul_rn(value, inv_rms), weight);
}
// 1 / rms from a row's sum of squares, taken in double as the CPU reference takes it.
__device__ __forceinline__ float inverse_rms(double sum_squares, int dim, float eps) {
  return static_cast<float>(1.0 / sqrt(sum_squares / dim + static_cast<double>(eps)));
}

// bf16(silu(gate) * up), as cpu::silu_mul forms it: one expression wherever a SwiGLU is applied,
// so that fused and separate paths agree bit for bit.
__device__ __forceinline__ uint16_t swiglu_bf16(float gate, float up) {
  return to_bf16_bits(gate / (1.0f + expf(-gate)) * up);
}

// cos and sin of one rotary pair as cpu::Rope computes them: a float32 angle, cos/sin in double
// scaled by the attention factor, rounded to float32.
__device__ __forceinline__ float2 rope_cos_sin(int32_t position, float inv_freq,
                                               float attention_factor) {
  const float angle = __fmul_rn(static_cast<float>(position), inv_freq);
  return make_float2(static_cast<float>(cos(static_cast<double>(angle)) * attention_factor),
                     static_cast<float>(sin(static_cast<double>(angle)) * attention_factor));
}
// The rotated pair (a, b) = (x[i], x[i + half]), in float32 without contraction so that both
// backends round alike.
__device__ __forceinline__ float2 rope_rotate(float a, float b, float2 cs) {
  return make_float2(__fsub_rn(__fmul_rn(a, cs.x), __fmul_rn(b, cs.y)),
                     __fadd_rn(__fmul_rn(b, cs.x), __fmul_rn(a, cs.y)));
}

// Pool row index (page * page_size + row) of slot `slot` in a segment's block table.
__device__ __forceinline__ int64_t pool_row(const int32_t* table, int slot, int page_size) {
  const int page_index = slot / page_size;
  return static_cast<int64_t>(table[page_index]) * page_size + (slot - page_index * page_size);
}

// Element offset of pool row r's key (value: + page_size * head_dim) in the bf16 pool.
__device__ __forceinline__ int64_t key_offset(int64_t pool_row_index, int page_size, int head_dim) {
  const int64_t page = pool_row_index / page_size;
  const int64_t row = pool_row_index - page * page_size;
  return (page * 2 * page_size + row) * head_dim;
}

}  // namespace ekva::cuda
