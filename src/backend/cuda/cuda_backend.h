#pragma once
// The CUDA backend: the whole model on the device (weights uploaded once in bf16, float32
// activations, K/V in one bf16 page pool with the layout's page ids), checked against the CPU
// backend. The layout and its metadata live on the host, mirrored: a step downloads each MoE
// layer's routing, while the retention scores the voting queries add stay on the device beside the
// pages (sync_scores copies a sequence's to the host when a selection is made there). A decode
// step's evictions are selected on the device; a prompt's compression and group quotas on the host
// (select_plan_evictions). Either way the device compacts and the host mirror follows.
//
// A decode step whose experts stay on the device runs as one CUDA graph: the first step of a
// shape runs its launches one by one, the next captures them, and later steps replay the capture.
// Everything a step changes (its inputs, the block tables, the decode attention's schedules) is
// copied, before the replay, to device buffers the capture reads in place; a buffer that moves (it
// grew) retires the captures that read it.
#include <cuda_runtime_api.h>

#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/decode_attention.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_model.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/paged_kv.h"

namespace ekva::cuda {

struct MoePairs;
struct ResidualNorm;

class CudaBackend : public Backend {
 public:
  // Uploads the model's weights. The layout must store bf16 (the device pool's element type).
  CudaBackend(const Model& model, const KvLayout& layout);
  // Runs on weights already uploaded (one upload for every engine of a model).
  CudaBackend(std::shared_ptr<const DeviceModel> weights, const KvLayout& layout);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::unique_ptr<Backend> clone() const override;
  std::vector<float> run(const StepPlan& plan, KvLayout& layout,
                         ForwardObserver* observer) override;
  // The tokens are drawn on the device; only they come to the host.
  std::vector<int32_t> run_tokens(const StepPlan& plan, KvLayout& layout,
                                  std::span<const TokenDraw> draws) override;
  void apply(const EvictionPlan& plan, KvLayout& layout) override;
  // Every plan selected (on the device where it can be, see above), then one compaction per layer
  // for all of them.
  void apply_all(std::span<const EvictionPlan> plans, KvLayout& layout) override;
  void sync_scores(int seq, KvLayout& layout) override;
  void disable_expert(int layer, int expert) override { disabled_ = {layer, expert}; }
  // Steps run as a captured CUDA graph, since construction.
  int64_t graph_steps() const { return graph_steps_; }

 private:
  // Shares `weights` (one upload for every clone); a pool of pool_rows rows.
  CudaBackend(std::shared_ptr<const DeviceModel> weights, int64_t pool_rows, int head_dim,
              int num_segments);
  // Growable device scratch of one step.
  template <typename T>
  T* scratch(DeviceBuffer<T>& buffer, size_t count);
  // The same for page-locked host staging.
  template <typename T>
  T* staging(PinnedBuffer<T>& buffer, size_t count);
  // Scratch for kernels that leave their workspace as they found it: zeroed when it grows.
  uint8_t* zeroed_scratch(DeviceBuffer<uint8_t>& buffer, size_t bytes);
  // A step, its logits left in logits_host_, or with draws its tokens in tokens_host_.
  void run_step(const StepPlan& plan, KvLayout& layout, ForwardObserver* observer,
                std::optional<std::span<const TokenDraw>> draws);
  // Uploads the step's integer inputs (tokens_ and what follows), the parts one after another.
  void upload_step(std::initializer_list<std::span<const int32_t>> parts);
  // Uploads every layer's block tables unless the device has them; sets views_.
  void upload_tables(const KvLayout& layout);
  // A decode step's attention schedules to the device (decode_plans_): one per layer, or one for
  // all when every layer retains the same counts (full KV, uniform budgets).
  void plan_decode_attention(const StepPlan& plan, bool scoring);
  // Embedding to logits_ (logit rows x vocabulary): every launch of a step, and nothing else, so
  // that a decode step can be captured.
  void forward(const StepPlan& plan, KvLayout& layout, ForwardObserver* observer,
               bool decode_kernel, bool scoring);
  // forward() for a decode step: replays its capture, captures it, or runs it (see above).
  void forward_decode(const StepPlan& plan, KvLayout& layout, bool scoring);
  // The host's scores of `seq` to the device, after a selection on the host pooled them (the
  // inverse of sync_scores).
  void upload_scores(int seq, const KvLayout& layout);
  // Selects and compacts on the device the evictions of every plan the host does not select
  // (on_host 0): each such plan's segments that outgrew their keep, listed from listed_at[p], their
  // pinned positions from pinned_at[p]. For the host mirror, `evicted` then lists the tables that
  // lost slots, pointing into eviction_host_, which holds the slots until the next call.
  void evict_on_device(std::span<const EvictionPlan> plans, const std::vector<uint8_t>& on_host,
                       const std::vector<size_t>& listed_at, const std::vector<size_t>& pinned_at,
                       const KvLayout& layout, std::vector<TableEviction>& evicted);
  // decode_kernel: the step holds at most one token per sequence, so the decode attention kernel
  // (one query per sequence over every retained slot) serves it, with decode_plan_index(layer).
  // host_reads_queries: an observer copies the step's rotated float32 queries to the host.
  void attention_block(int layer, const StepPlan& plan, bool decode_kernel, bool scoring,
                       bool host_reads_queries);
  void mlp(const DeviceMlp& mlp, const uint16_t* x, int rows, float* y);
  // next_norm: the norm after the block (the next layer's attention norm, or the final one).
  // Returns whether the block added its output to the residual x_ and normalised the sum with
  // next_norm into x_bf16_ itself (in the experts' sum, combine_pairs), leaving delta_ unused.
  bool moe_block(int layer, int moe_index, const StepPlan& plan, KvLayout& layout,
                 ForwardObserver* observer, const float* next_norm);
  // Whether a step of n tokens runs its routed experts as grouped products with the pairs sorted
  // on the device (grouped_experts): when the model's experts get few pairs each (any decode
  // step; a prompt of fine-grained experts), where one product per expert would be many small
  // ones, and no observer reads K/V or expert outputs (a prompt's recorder reads the routing
  // alone).
  bool experts_grouped(int n, const ForwardObserver* observer) const;
  // The routed experts as grouped products that read each touched expert's weights once for each
  // group of its pairs, which it sorts into `pairs` unless the router has (sorted); the host
  // learns the routing when the step ends.
  // With next_norm.weight, a step of wide groups (a prompt) adds the experts' sum to the residual
  // and normalises it in combine_pairs (returns whether it did).
  bool grouped_experts(int layer, int n, const int32_t* experts, const float* gates,
                       const MoePairs& pairs, bool sorted, float* y, float* delta,
                       const ResidualNorm& next_norm);
  // The routed experts with the routing on the host: one product per touched expert over its
  // rows (prefill), and the observer's callbacks.
  void host_routed_experts(int layer, int moe_index, const StepPlan& plan, KvLayout& layout,
                           ForwardObserver* observer, const int32_t* experts_d,
                           const float* gates_d, float* y, float* delta);
  // The host mirror learns each slot's primary expert, as the CPU backend records it.
  void record_routing(int layer, const StepPlan& plan, KvLayout& layout,
                      const int32_t* experts) const;

  std::shared_ptr<const DeviceModel> weights_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Gemm> gemm_;
  int64_t pool_rows_ = 0;
  int head_dim_ = 0;
  int num_segments_ = 0;  // sequences x KV heads of one layer
  DeviceBuffer<uint16_t> pool_;
  DeviceBuffer<TokenMeta> meta_;
  DeviceBuffer<float> score_delta_;  // pool-parallel: what this step's voting queries added
  std::vector<PagedKvLayer> views_;  // per layer, into ints_
  DeviceBuffer<int32_t> step_ints_;  // the step's integer inputs: see run()
  // Their host side: pinned, so that the copy is the DMA's alone (from pageable memory the driver
  // copies a prompt's slots, a few MB, through a bounce buffer first).
  PinnedBuffer<int32_t> step_ints_host_;
  // The block tables (upload_tables): tables_ is the host copy, table_at_ each layer's start in
  // it, read from tables_of_ at its table_version() tables_version_.
  DeviceBuffer<int32_t> ints_;
  std::vector<int32_t> tables_;
  std::vector<size_t> table_at_;
  const KvLayout* tables_of_ = nullptr;
  uint64_t tables_version_ = 0;
  DeviceBuffer<int32_t> eviction_ints_;  // a decode selection's parameters and results
  PinnedBuffer<int32_t> eviction_host_;  // and their host side
  PinnedBuffer<float> logits_host_;
  DeviceBuffer<int32_t> drawn_;
  PinnedBuffer<int32_t> tokens_host_;
  DeviceBuffer<TokenDraw> draws_;
  DeviceBuffer<uint8_t> sample_workspace_;
  DeviceBuffer<uint8_t> greedy_workspace_;
  DeviceBuffer<int32_t> score_rows_;  // the pool rows sync_scores and apply_all copy scores of
  DeviceBuffer<float> row_scores_;
  const int32_t* tokens_ = nullptr;
  const int32_t* sequences_ = nullptr;
  const int32_t* positions_ = nullptr;
  const int32_t* slots_ = nullptr;  // [layer][token][kv head]
  const int32_t* logit_rows_ = nullptr;
  const int32_t* tiles_ = nullptr;   // prefill_attention's tiles: [first token, count] each
  const int32_t* voters_ = nullptr;  // the step's voting tokens, when it is not a decode step
  bool batch_in_order_ = false;      // the step's token t is sequence t's, for every sequence
  bool logits_in_order_ = false;     // logits are wanted for every token, in order
  int num_tiles_ = 0;
  int num_voters_ = 0;
  DeviceBuffer<uint8_t> score_query_, flags_, compaction_;
  // qkv_: q [tokens, q_dim], then k and v [tokens, kv_dim] each.
  DeviceBuffer<float> x_, normed_, qkv_, delta_, gate_up_, y_, router_logits_, gates_,
      shared_weight_, logits_;
  DeviceBuffer<float> qk_inverse_rms_;  // [2, tokens]: a whole projection's QK-norm (KvAppend)
  DeviceBuffer<uint16_t> x_bf16_, attn_bf16_, rows_bf16_, hidden_bf16_;
  DeviceBuffer<uint16_t> decode_q_, decode_out_;  // [sequences, query heads, head_dim]
  DeviceBuffer<uint16_t> prefill_q_;              // [tokens, query heads, head_dim]
  DeviceBuffer<float2> rotations_;                // [tokens, head_dim / 2]: rope_rotations
  // A decode step's attention: a plan per layer or one that every layer shares, their schedules
  // on the device at fixed places (plan x schedule bytes), staged in pinned memory, and one
  // scratch the layers share (zeroed when allocated: runs leave it ready for the next).
  std::vector<DecodeAttentionPlan> decode_plans_;
  size_t decode_plan_index(int layer) const { return decode_plans_.size() == 1 ? 0 : layer; }
  int64_t decode_grid_ctas_ = 0;
  DeviceBuffer<uint8_t> decode_schedules_, decode_scratch_;
  PinnedBuffer<uint8_t> decode_schedules_host_;
  DeviceBuffer<int32_t> experts_, expert_rows_, pair_ints_;  // experts_: [MoE layer, token, k]
  DeviceBuffer<uint32_t> router_workspace_;                  // route_experts'
  DeviceBuffer<float> expert_gates_, pair_gates_;
  // This step's (layer, MoE index) whose routing is still on the device.
  std::vector<std::pair<int, int>> routed_on_device_;
  std::pair<int, int> disabled_{-1, -1};

  // What a captured decode step bakes in besides the device buffers' places.
  struct StepShape {
    int tokens = 0;
    int logit_rows = 0;
    int num_sequences = 0;
    bool scoring = false;
    std::pair<int, int> disabled{-1, -1};
    bool batch_in_order = false;
    bool logits_in_order = false;
    bool one_decode_plan = false;
    uint64_t buffers = 0;  // buffers_version_ at capture
    bool operator==(const StepShape&) const = default;
  };
  struct StepGraph {
    StepShape shape;
    cudaGraphExec_t exec = nullptr;
    std::vector<std::pair<int, int>> routed_on_device;
  };
  // Counts the moves of device buffers a step reads (a scratch that grew, tables laid out anew).
  uint64_t buffers_version_ = 0;
  std::vector<size_t> table_capacity_;    // each layer's room for page ids in ints_
  std::vector<StepGraph> graphs_;         // the latest first
  std::optional<StepShape> eager_shape_;  // the last step run launch by launch, buffers unmoved
  bool capturing_ = false;
  int64_t graph_steps_ = 0;
};

// The factory an EngineOptions takes to run on the GPU. Its engines share one upload of a model's
// weights, made by the first of them.
BackendFactory cuda_backend_factory();
// The factory over weights already on the device (a checkpoint uploaded once, or seeded random
// weights): every engine's backend shares them. A model of another shape is refused; its own
// weights, if it has any, are not read.
BackendFactory cuda_backend_factory(std::shared_ptr<const DeviceModel> weights);

// The current device's memory now (cudaMemGetInfo).
struct DeviceMemory {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
DeviceMemory device_memory();

// Bytes of device memory a layout's KV pool takes when a backend is made: K/V, metadata and the
// per-slot scratch (eviction scores and flags, the compaction's row lists).
size_t kv_pool_device_bytes(const KvLayout& layout);

// The most device memory a backend's step workspaces can take: they grow on demand, each to at
// most twice its largest need, for steps of at most `step_tokens` tokens (a prefill chunk or a
// decode batch) with logits wanted for at most `num_sequences` rows, over a pool of `pool_pages`
// pages of `page_size` tokens. What a caller keeps free beside the weights and the pool; cuBLAS's
// own workspace and the kernels the runtime loads on first use are not counted. The decode
// attention's score buffer is sized for a layer holding twice the mean share of the pool. Asks the
// device for the sampler's sort workspace (cub's), so it needs one.
size_t step_workspace_bytes(const ModelSpec& spec, int step_tokens, int num_sequences,
                            int64_t pool_pages, int page_size);

}  // namespace ekva::cuda
