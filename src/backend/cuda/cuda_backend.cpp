#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_attention.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_ops.h"
#include "backend/cuda/model_ops.h"
#include "core/error.h"
#include "kv/kv_pages.h"

namespace ekva::cuda {
namespace {

const KvLayout& checked(const KvLayout& layout) {
  if (layout.dtype() != DType::kBF16) {
    fail(ErrorKind::kUnsupported,
         "the CUDA backend stores K/V in bf16; the cache was set up for {} (use --kv-dtype bf16)",
         dtype_name(layout.dtype()));
  }
  return layout;
}

int64_t pool_rows(const KvLayout& layout) {
  return layout.capacity_pages() * layout.page_size();
}

}  // namespace

size_t kv_pool_device_bytes(const KvLayout& layout) {
  return static_cast<size_t>(pool_rows(layout)) *
             (2 * static_cast<size_t>(layout.head_dim()) * sizeof(uint16_t) + sizeof(TokenMeta) +
              sizeof(float) + sizeof(uint8_t)) +
         compaction_workspace_bytes(pool_rows(layout),
                                    layout.num_sequences() * layout.num_kv_heads());
}

DeviceMemory device_memory() {
  DeviceMemory m;
  EKVA_CUDA_CHECK(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
  return m;
}

size_t step_workspace_bytes(const ModelSpec& s, int step_tokens, int num_sequences,
                            int64_t pool_pages, int page_size) {
  // The buffers run() and its blocks grow (scratch), each at its largest for such a step.
  const size_t n = static_cast<size_t>(std::max(step_tokens, 1));
  const size_t S = static_cast<size_t>(std::max(num_sequences, 1));
  const size_t k = static_cast<size_t>(std::max(s.top_k, 1));
  const size_t L = static_cast<size_t>(s.num_layers), H = static_cast<size_t>(s.num_kv_heads);
  const size_t hidden = static_cast<size_t>(s.hidden_size);
  const size_t moe_layers = static_cast<size_t>(s.num_moe_layers());
  // One MLP product's intermediate rows per token: the routed experts' k rows (grouped, or one
  // expert's rows on the host-routed path), the shared expert's or the dense MLP's one.
  const size_t inter = std::max({k * static_cast<size_t>(s.expert_intermediate),
                                 static_cast<size_t>(s.shared_intermediate),
                                 static_cast<size_t>(s.dense_intermediate)});
  const size_t floats = n * (2 * hidden                 // x_, normed_
                             + s.q_dim()                // qkv_
                             + 2 * s.kv_dim() + hidden  // delta_
                             + k * hidden               // y_
                             + s.num_experts            // router_logits_
                             + 2 * inter                // gate_up_
                             + 1                        // shared_weight_
                             + 2                        // qk_inverse_rms_
                             + 2 * k                    // expert_gates_, pair_gates_
                             + moe_layers * k) +        // gates_
                        S * s.vocab_size;               // logits_
  const size_t halves = n * (hidden                     // x_bf16_
                             + s.q_dim()                // attn_bf16_
                             + k * hidden               // rows_bf16_
                             + inter) +                 // hidden_bf16_
                        2 * S * s.q_dim();              // decode_q_, decode_out_
  const size_t ints = n * (3 + L * H + 1                // the step's inputs (step_ints_)
                           + moe_layers * k             // experts_
                           + k                          // expert_rows_
                           + 5 * k) +                   // pair_ints_
                      L * (2 * S * H + 1 + 16) +
                      2 * static_cast<size_t>(pool_pages) + 2;  // tables, with room to grow
  // The decode attention: each layer's schedule, and the scratch the layers share (partials, and
  // the scores of one layer's retained slots per query head of a group).
  const size_t group = static_cast<size_t>(s.num_heads / std::max(s.num_kv_heads, 1));
  const size_t pieces = S * H + 4096;  // a piece per segment plus one per CTA of a grid
  const size_t layer_rows =
      2 * static_cast<size_t>(pool_pages) * static_cast<size_t>(page_size) / std::max<size_t>(L, 1);
  const size_t decode = L * (2 * pieces * 4 + 2 * S * H + 2) * sizeof(int32_t) +
                        pieces * group * (s.head_dim * sizeof(uint16_t) + 2 * sizeof(float)) +
                        S * H * sizeof(int32_t) + layer_rows * group * sizeof(float);
  // Evictions: a decode selection's parameters and results per segment, and the rows and scores
  // of one sequence's retained slots (sync_scores, a host selection's flags, pinned positions).
  const size_t sequence_rows = static_cast<size_t>(s.max_position) * L * H;
  const size_t evictions =
      S * L * H * (kDecodeEvictParams + kMaxDecodeEvictions + 1) * sizeof(int32_t) +
      sequence_rows * (2 * sizeof(int32_t) + sizeof(float));
  // Drawn tokens: the draws, the tokens, the greedy reduction's and the sampler's sort of every
  // row's logits.
  const size_t draws = S * (sizeof(TokenDraw) + sizeof(int32_t)) +
                       greedy_tokens_workspace(static_cast<int>(S), s.vocab_size) +
                       sample_tokens_workspace(static_cast<int>(S), s.vocab_size);
  const size_t bytes = floats * sizeof(float) + halves * sizeof(uint16_t) + ints * sizeof(int32_t) +
                       decode + evictions + draws + n /* score_query_ */;
  return 2 * bytes;
}

CudaBackend::CudaBackend(const Model& model, const KvLayout& layout)
    : CudaBackend(std::make_shared<const DeviceModel>(model, kv_pool_device_bytes(checked(layout))),
                  layout) {}

CudaBackend::CudaBackend(std::shared_ptr<const DeviceModel> weights, const KvLayout& layout)
    : CudaBackend(std::move(weights), pool_rows(checked(layout)), layout.head_dim(),
                  layout.num_sequences() * layout.num_kv_heads()) {}

CudaBackend::CudaBackend(std::shared_ptr<const DeviceModel> weights, int64_t rows, int head_dim,
                         int num_segments)
    : weights_(std::move(weights)),
      pool_rows_(rows),
      head_dim_(head_dim),
      num_segments_(num_segments) {
  EKVA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  gemm_ = std::make_unique<Gemm>(stream_);
  pool_ = DeviceBuffer<uint16_t>(static_cast<size_t>(pool_rows_) * 2 * head_dim_);
  meta_ = DeviceBuffer<TokenMeta>(static_cast<size_t>(pool_rows_));
  score_delta_ = DeviceBuffer<float>(static_cast<size_t>(pool_rows_));
  flags_ = DeviceBuffer<uint8_t>(static_cast<size_t>(pool_rows_));
  compaction_ = DeviceBuffer<uint8_t>(compaction_workspace_bytes(pool_rows_, num_segments_));
  // A slot is read only once written, but a timing run may reserve slots without running them:
  // they read as zero K/V at position 0 rather than as whatever the allocation held.
  EKVA_CUDA_CHECK(cudaMemsetAsync(pool_.data(), 0, pool_.bytes(), stream_));
  EKVA_CUDA_CHECK(cudaMemsetAsync(meta_.data(), 0, meta_.bytes(), stream_));
  EKVA_CUDA_CHECK(cudaMemsetAsync(flags_.data(), 0, flags_.bytes(), stream_));  // apply_all's
  router_workspace_ = DeviceBuffer<uint32_t>(kRouterWorkspaceWords);
  EKVA_CUDA_CHECK(cudaMemsetAsync(router_workspace_.data(), 0, router_workspace_.bytes(), stream_));
}

CudaBackend::~CudaBackend() {
  for (StepGraph& g : graphs_) cudaGraphExecDestroy(g.exec);
  gemm_.reset();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

std::unique_ptr<Backend> CudaBackend::clone() const {
  std::unique_ptr<CudaBackend> copy(
      new CudaBackend(weights_, pool_rows_, head_dim_, num_segments_));
  // On the copy's stream, after the zeroing its constructor queued there, and once this backend's
  // own work is done.
  EKVA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  EKVA_CUDA_CHECK(cudaMemcpyAsync(copy->pool_.data(), pool_.data(), pool_.bytes(),
                                  cudaMemcpyDeviceToDevice, copy->stream_));
  EKVA_CUDA_CHECK(cudaMemcpyAsync(copy->meta_.data(), meta_.data(), meta_.bytes(),
                                  cudaMemcpyDeviceToDevice, copy->stream_));
  EKVA_CUDA_CHECK(cudaStreamSynchronize(copy->stream_));
  copy->disabled_ = disabled_;
  return copy;
}

template <typename T>
T* CudaBackend::scratch(DeviceBuffer<T>& buffer, size_t count) {
  if (buffer.size() < count) {
    // A capture follows a step of the same shape that grew nothing (forward_decode).
    if (capturing_) {
      fail(ErrorKind::kInvalidArgument,
           "CUDA backend: a captured step needs a buffer of {} "
           "elements where {} were reserved",
           count, buffer.size());
    }
    EKVA_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old buffer may still be read
    buffer = DeviceBuffer<T>(std::max(count, buffer.size() * 2));
    ++buffers_version_;
  }
  return buffer.data();
}

uint8_t* CudaBackend::zeroed_scratch(DeviceBuffer<uint8_t>& buffer, size_t bytes) {
  const bool grows = buffer.size() < bytes;
  uint8_t* memory = scratch(buffer, bytes);
  if (grows) EKVA_CUDA_CHECK(cudaMemsetAsync(memory, 0, buffer.bytes(), stream_));
  return memory;
}

template <typename T>
T* CudaBackend::staging(PinnedBuffer<T>& buffer, size_t count) {
  if (buffer.size() < count) {
    EKVA_CUDA_CHECK(cudaStreamSynchronize(stream_));  // a copy may still use the old buffer
    buffer = PinnedBuffer<T>(std::max(count, buffer.size() * 2));
  }
  return buffer.data();
}

void CudaBackend::upload_step(std::initializer_list<std::span<const int32_t>> parts) {
  size_t count = 0;
  for (const std::span<const int32_t> part : parts) count += part.size();
  int32_t* host = staging(step_ints_host_, count);
  int32_t* at = host;
  for (const std::span<const int32_t> part : parts) at = std::copy(part.begin(), part.end(), at);
  int32_t* device = scratch(step_ints_, count);
  EKVA_CUDA_CHECK(
      cudaMemcpyAsync(device, host, count * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  tokens_ = device;  // the step's inputs, in the order run() lays them out
}

void CudaBackend::upload_tables(const KvLayout& layout) {
  // The device keeps each table's length itself (appends raise it, compactions lower it), so the
  // tables go up again only when a page was added or released.
  if (tables_of_ == &layout && tables_version_ == layout.table_version()) return;
  const int S = layout.num_sequences(), H = layout.num_kv_heads(), L = layout.num_layers();
  // Each layer's region: offsets [S*H + 1], lengths [S*H], then room for its page ids. The room
  // only grows, and then to twice the need, so that the regions stay where a captured step reads
  // them while pages come and go.
  std::vector<size_t> pages(L, 0);
  for (int l = 0; l < L; ++l) {
    for (int s = 0; s < S; ++s) {
      for (int h = 0; h < H; ++h) pages[l] += layout.table(s, l, h).pages.size();
    }
  }
  bool moved = table_capacity_.size() != static_cast<size_t>(L);
  for (int l = 0; l < L && !moved; ++l) moved = pages[l] > table_capacity_[l];
  if (moved) {
    table_capacity_.resize(L);
    for (int l = 0; l < L; ++l) table_capacity_[l] = 2 * pages[l] + 16;
    ++buffers_version_;
  }
  std::vector<int32_t>& ints = tables_;
  std::vector<size_t>& at = table_at_;
  at.assign(L, 0);
  size_t total = 0;
  for (int l = 0; l < L; ++l) {
    at[l] = total;
    total += 2 * static_cast<size_t>(S) * H + 1 + table_capacity_[l];
  }
  ints.assign(total, 0);
  for (int l = 0; l < L; ++l) {
    int32_t* offsets = ints.data() + at[l];
    int32_t* lengths = offsets + S * H + 1;
    int32_t* ids = lengths + S * H;
    for (int s = 0; s < S; ++s) {
      for (int h = 0; h < H; ++h) {
        const HeadTable& t = layout.table(s, l, h);
        const int segment = s * H + h;
        std::copy(t.pages.begin(), t.pages.end(), ids + offsets[segment]);
        offsets[segment + 1] = offsets[segment] + static_cast<int32_t>(t.pages.size());
        lengths[segment] = t.size();
      }
    }
  }
  int32_t* device = scratch(ints_, ints.size());
  EKVA_CUDA_CHECK(cudaMemcpyAsync(device, ints.data(), ints.size() * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream_));
  views_.assign(L, {});
  for (int l = 0; l < L; ++l) {
    PagedKvLayer& v = views_[l];
    v.pool = pool_.data();
    v.meta = meta_.data();
    v.page_offsets = device + at[l];
    v.lengths = device + at[l] + S * H + 1;
    v.page_ids = device + at[l] + 2 * S * H + 1;
    v.num_sequences = S;
    v.num_kv_heads = H;
    v.head_dim = layout.head_dim();
    v.page_size = layout.page_size();
  }
  tables_of_ = &layout;
  tables_version_ = layout.table_version();
}

void CudaBackend::plan_decode_attention(const StepPlan& plan, bool scoring) {
  const ModelSpec& s = weights_->spec();
  const DecodeAttentionShape shape{plan.num_sequences, s.num_heads,         s.num_kv_heads,
                                   s.head_dim,         views_[0].page_size, scoring};
  if (decode_grid_ctas_ == 0) decode_grid_ctas_ = DecodeAttentionPlan::grid_ctas(shape);
  const size_t segments = static_cast<size_t>(plan.num_sequences) * s.num_kv_heads;
  const auto lengths_of = [&](int l) {
    return std::span<const int32_t>(plan.lengths).subspan(l * segments, segments);
  };
  bool one_plan = true;
  for (int l = 1; l < s.num_layers && one_plan; ++l) {
    one_plan = std::ranges::equal(lengths_of(l), lengths_of(0));
  }
  decode_plans_.clear();
  decode_plans_.reserve(s.num_layers);
  size_t scratch_bytes = 0;
  for (int l = 0; l < (one_plan ? 1 : s.num_layers); ++l) {
    // Layers that retain the same counts share one schedule.
    if (l > 0 && std::ranges::equal(lengths_of(l), lengths_of(l - 1))) {
      decode_plans_.push_back(decode_plans_.back());
    } else {
      decode_plans_.emplace_back(shape, lengths_of(l), decode_grid_ctas_);
    }
    scratch_bytes = std::max(scratch_bytes, decode_plans_.back().scratch_bytes());
  }
  const size_t schedule_bytes = decode_plans_[0].schedule_bytes();
  const size_t bytes = schedule_bytes * decode_plans_.size();
  uint8_t* host = staging(decode_schedules_host_, bytes);
  for (size_t p = 0; p < decode_plans_.size(); ++p) {
    const std::span<const int32_t> schedule = decode_plans_[p].schedule();
    std::memcpy(host + p * schedule_bytes, schedule.data(), schedule_bytes);
  }
  EKVA_CUDA_CHECK(cudaMemcpyAsync(scratch(decode_schedules_, bytes), host, bytes,
                                  cudaMemcpyHostToDevice, stream_));
  zeroed_scratch(decode_scratch_, scratch_bytes);
}

void CudaBackend::attention_block(int layer, const StepPlan& plan, bool decode_kernel, bool scoring,
                                  bool host_reads_queries) {
  const int n = plan.batch.size();
  const DeviceModel& w = *weights_;
  const ModelSpec& s = w.spec();
  const DeviceLayer& D = w.layer(layer);
  const int d = s.head_dim, hidden = s.hidden_size;
  float* q = scratch(qkv_, static_cast<size_t>(n) * (s.q_dim() + 2 * s.kv_dim()));
  float* k = q + static_cast<size_t>(n) * s.q_dim();
  float* v = k + static_cast<size_t>(n) * s.kv_dim();
  gemm_->bf16_qkv(x_bf16_.data(), n, D.qkv.data.data(), s.q_dim(), s.kv_dim(), hidden, q);
  if (D.q_bias.size() > 0) add_bias(q, D.q_bias.data(), n, s.q_dim(), stream_);
  if (D.k_bias.size() > 0) add_bias(k, D.k_bias.data(), n, s.kv_dim(), stream_);
  if (D.v_bias.size() > 0) add_bias(v, D.v_bias.data(), n, s.kv_dim(), stream_);
  const float eps = static_cast<float>(s.rms_eps);
  // QK-norm runs in the append's launch, unless a clip comes between them; a whole projection's
  // with its rows' 1 / rms found before. k follows q in qkv_, so both norms run in one launch.
  const bool norm_in_append = s.qk_norm != QkNorm::kNone && !s.clip_qkv;
  const bool whole_projection = s.qk_norm == QkNorm::kWholeProjection;
  float* inverse_rms = nullptr;
  if (norm_in_append && whole_projection) {
    inverse_rms = scratch(qk_inverse_rms_, 2 * static_cast<size_t>(n));
    inverse_rms_pair(q, n, s.q_dim(), n, s.kv_dim(), eps, inverse_rms, stream_);
  } else if (!norm_in_append && whole_projection) {
    rms_norm_pair(q, n, s.q_dim(), D.q_norm.data(), n, s.kv_dim(), D.k_norm.data(), eps, stream_);
  } else if (!norm_in_append && s.qk_norm == QkNorm::kPerHead) {
    rms_norm_pair(q, n * s.num_heads, d, D.q_norm.data(), n * s.num_kv_heads, d, D.k_norm.data(),
                  eps, stream_);
  }
  if (s.clip_qkv) {
    for (auto [p, count] : {std::pair{q, n * s.q_dim()}, std::pair{k, n * s.kv_dim()},
                            std::pair{v, n * s.kv_dim()}}) {
      clamp_in_place(p, count, *s.clip_qkv, stream_);
    }
  }
  const size_t decode_rows = static_cast<size_t>(plan.num_sequences) * s.q_dim();
  const bool prefill_kernel = !decode_kernel && prefill_attention_supported(d);
  const bool prompt_votes = scoring && num_voters_ > 0;
  // The queries' RoPE runs in the append's launch, which writes the tensor-core kernels' bf16
  // query rows; the float32 kernels (the general one, the prompt's voting) and an observer that
  // copies them to the host read them in place.
  uint16_t* q_rows = decode_kernel    ? scratch(decode_q_, decode_rows)
                     : prefill_kernel ? scratch(prefill_q_, static_cast<size_t>(n) * s.q_dim())
                                      : nullptr;
  KvAppend append;
  append.queries = q;
  append.num_q_heads = s.num_heads;
  append.queries_in_place =
      q_rows == nullptr || host_reads_queries || (prefill_kernel && prompt_votes);
  append.query_rows = decode_kernel ? sequences_ : nullptr;
  append.query_rows_bf16 = q_rows;
  append.keys = k;
  append.values = v;
  append.sequences = sequences_;
  append.positions = positions_;
  append.slots = slots_ + static_cast<size_t>(layer) * n * s.num_kv_heads;
  append.rotations = rotations_.data();
  append.count = n;
  if (norm_in_append) {
    append.q_norm = D.q_norm.data();
    append.k_norm = D.k_norm.data();
    append.norm_eps = eps;
    append.projection_inverse_rms = inverse_rms;
  }
  append_kv(views_[layer], append, stream_);
  uint16_t* out = scratch(attn_bf16_, static_cast<size_t>(n) * s.q_dim());
  if (decode_kernel) {
    // A batch of every sequence in order writes its output rows where the O product reads them.
    uint16_t* out_rows = batch_in_order_ ? out : scratch(decode_out_, decode_rows);
    const DecodeAttentionPlan& attention = decode_plans_[decode_plan_index(layer)];
    attention.run(views_[layer], q_rows, out_rows, scoring ? score_delta_.data() : nullptr,
                  decode_schedules_.data() + decode_plan_index(layer) * attention.schedule_bytes(),
                  decode_scratch_.data(), stream_);
    if (!batch_in_order_) gather_rows(out_rows, sequences_, n, s.q_dim(), out, stream_);
  } else if (prefill_kernel) {
    PrefillAttention attention;
    attention.q = q_rows;
    attention.sequences = sequences_;
    attention.positions = positions_;
    attention.tiles = tiles_;
    attention.num_tiles = num_tiles_;
    attention.out = out;
    attention.num_q_heads = s.num_heads;
    prefill_attention(views_[layer], attention, stream_);
    if (prompt_votes) {
      PagedAttention voting;
      voting.q = q;
      voting.tokens = voters_;
      voting.sequences = sequences_;
      voting.positions = positions_;
      voting.score_query = score_query_.data();
      voting.score_delta = score_delta_.data();
      voting.out = out;
      voting.n = num_voters_;
      voting.num_q_heads = s.num_heads;
      paged_attention(views_[layer], voting, stream_);
    }
  } else {
    PagedAttention attention;
    attention.q = q;
    attention.sequences = sequences_;
    attention.positions = positions_;
    attention.score_query = scoring ? score_query_.data() : nullptr;
    attention.score_delta = scoring ? score_delta_.data() : nullptr;
    attention.out = out;
    attention.n = n;
    attention.num_q_heads = s.num_heads;
    paged_attention(views_[layer], attention, stream_);
  }
  float* delta = scratch(delta_, static_cast<size_t>(n) * hidden);
  gemm_->bf16(out, n, D.o.data.data(), hidden, s.q_dim(), delta);
  if (D.o_bias.size() > 0) add_bias(delta, D.o_bias.data(), n, hidden, stream_);
}

void CudaBackend::mlp(const DeviceMlp& m, const uint16_t* x, int rows, float* y) {
  const int hidden = m.down.rows, inter = m.inter();
  float* gate_up = scratch(gate_up_, static_cast<size_t>(rows) * 2 * inter);
  gemm_->bf16(x, rows, m.gate_up.data.data(), 2 * inter, hidden, gate_up);
  uint16_t* h = scratch(hidden_bf16_, static_cast<size_t>(rows) * inter);
  silu_mul(gate_up, rows, inter, h, stream_);
  gemm_->bf16(h, rows, m.down.data.data(), hidden, inter, y);
}

bool CudaBackend::moe_block(int layer, int moe_index, const StepPlan& plan, KvLayout& layout,
                            ForwardObserver* observer, const float* next_norm) {
  const ForwardBatch& batch = plan.batch;
  const ModelSpec& s = weights_->spec();
  const DeviceLayer& D = weights_->layer(layer);
  const int n = batch.size(), hidden = s.hidden_size;
  float* delta = scratch(delta_, static_cast<size_t>(n) * hidden);
  float* y = scratch(y_, static_cast<size_t>(n) * std::max(s.top_k, 1) * hidden);
  if (!s.layer_is_moe[layer]) {
    mlp(D.dense, x_bf16_.data(), n, delta);
    return false;
  }
  const int E = s.num_experts, k = s.top_k;
  float* logits = scratch(router_logits_, static_cast<size_t>(n) * E);
  const size_t pairs = static_cast<size_t>(n) * k;
  // Each MoE layer's routing stays on the device until the step ends (experts_, gates_).
  int32_t* experts_d = experts_.data() + moe_index * pairs;
  float* gates_d = gates_.data() + moe_index * pairs;
  const bool grouped = experts_grouped(n, observer);
  const MoePairs p = grouped ? moe_pairs(scratch(pair_ints_, moe_pair_ints(pairs)),
                                         scratch(pair_gates_, pairs), pairs)
                             : MoePairs{};
  // A one-token step's router writes its pairs in order itself, which saves the sort's kernel.
  const bool router_sorts = grouped && n == 1 && route_experts_supported(n, hidden, E);
  if (route_experts_supported(n, hidden, E)) {
    route_experts(normed_.data(), D.router.data(), n, hidden, E, k, s.norm_topk_prob, logits,
                  experts_d, gates_d, router_workspace_.data(), router_sorts ? &p : nullptr,
                  stream_);
  } else {
    gemm_->f32(normed_.data(), n, D.router.data(), E, hidden, logits);
    route_tokens(logits, n, E, k, s.norm_topk_prob, experts_d, gates_d, stream_);
  }
  // Steps whose experts get few pairs each (decode; a prompt of fine-grained experts) keep the
  // experts on the device: no host round trip per layer, and each touched expert's weights read
  // once per group of its pairs on the tensor cores. Others (a coarse model's prompt, observers
  // that read K/V or expert outputs) run one cuBLAS product per touched expert.
  if (grouped) {
    if (observer == nullptr) {
      routed_on_device_.emplace_back(layer, moe_index);
    } else {  // one that reads the routing alone (a prompt's recorder)
      std::vector<int32_t> experts(pairs);
      std::vector<float> gates(pairs);
      std::vector<float> host_logits(static_cast<size_t>(n) * E);
      EKVA_CUDA_CHECK(cudaMemcpyAsync(experts.data(), experts_d, pairs * sizeof(int32_t),
                                      cudaMemcpyDeviceToHost, stream_));
      EKVA_CUDA_CHECK(cudaMemcpyAsync(gates.data(), gates_d, pairs * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream_));
      EKVA_CUDA_CHECK(cudaMemcpyAsync(host_logits.data(), logits,
                                      host_logits.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                      stream_));
      EKVA_CUDA_CHECK(cudaStreamSynchronize(stream_));
      record_routing(layer, plan, layout, experts.data());
      observer->on_router_logits(layer, moe_index, host_logits.data(), n, E);
      observer->on_layer_routed(layer, batch, layout, nullptr, nullptr, experts.data(),
                                gates.data(), k);
    }
    // Shared experts add to delta after the routed ones.
    ResidualNorm norm;
    if (s.shared_intermediate == 0) {
      norm.weight = next_norm;
      norm.eps = static_cast<float>(s.rms_eps);
      norm.out_bf16 = x_bf16_.data();
    }
    if (grouped_experts(layer, n, experts_d, gates_d, p, router_sorts, y, delta, norm)) {
      return true;
    }
  } else {
    EKVA_CUDA_CHECK(
        cudaMemsetAsync(delta, 0, static_cast<size_t>(n) * hidden * sizeof(float), stream_));
    host_routed_experts(layer, moe_index, plan, layout, observer, experts_d, gates_d, y, delta);
  }
  if (s.shared_intermediate > 0) {
    const float* weight = nullptr;
    if (s.shared_expert_gated) {
      float* w = scratch(shared_weight_, n);
      gemm_->f32(normed_.data(), n, D.shared_gate.data(), 1, hidden, w);
      sigmoid_in_place(w, n, stream_);
      weight = w;
    }
    mlp(D.shared, x_bf16_.data(), n, y);
    scatter_add_rows(y, nullptr, weight, n, hidden, delta, stream_);
  }
  return false;
}

bool CudaBackend::experts_grouped(int n, const ForwardObserver* observer) const {
  const ModelSpec& s = weights_->spec();
  // At most 8 groups per expert on average (routed_experts_grouped): an expert's groups run side
  // by side and share its weights in L2, where a coarse model's thousand pairs per expert
  // (Mixtral's 4096-token prompt) are one cuBLAS product each.
  static_assert(kMaxGroupedStepTokens == kMaxGroupedTokens &&
                kMaxMeanGroupedPairs == 8 * kMaxGroupedTokens);
  const bool routing_only =
      observer == nullptr || (!observer->reads_kv() && !observer->reads_expert_outputs());
  return routing_only && routed_experts_grouped(n, s.top_k, s.num_experts) &&
         grouped_gemm_supported(s.hidden_size, s.num_experts) &&
         grouped_gemm_supported(s.expert_intermediate, s.num_experts);
}

bool CudaBackend::grouped_experts(int layer, int n, const int32_t* experts, const float* gates,
                                  const MoePairs& p, bool sorted, float* y, float* delta,
                                  const ResidualNorm& next_norm) {
  const ModelSpec& s = weights_->spec();
  const DeviceLayer& D = weights_->layer(layer);
  const int E = s.num_experts, k = s.top_k, hidden = s.hidden_size, inter = s.expert_intermediate;
  const size_t pairs = static_cast<size_t>(n) * k;
  if (!sorted) sort_pairs(experts, gates, n, k, E, p, stream_);
  const auto product = [&](const GroupedGemm& g) { grouped_gemm(g, p, n, k, E, stream_); };
  // A one-token step's products are GEMVs that also apply the SwiGLU and gate and add the
  // experts' outputs, which then take no kernels of their own; wide groups' gate-and-up product
  // applies the SwiGLU too.
  const bool one_token = n == 1;
  const bool wide = moe_group_tokens(n, k, E) == kWideGroupTokens;
  const bool fused_swiglu = one_token || wide;
  const int disabled = disabled_.first == layer ? disabled_.second : -1;
  uint16_t* h = scratch(hidden_bf16_, pairs * inter);
  GroupedGemm up;
  up.weights = D.expert_gate_up.data();
  up.input = x_bf16_.data();
  up.input_is_token = true;
  up.out = fused_swiglu ? nullptr : scratch(gate_up_, pairs * 2 * inter);
  up.out_rows = 2 * inter;
  up.in_cols = hidden;
  if (fused_swiglu) up.swiglu_out = h;
  product(up);
  if (!fused_swiglu) silu_mul(up.out, static_cast<int>(pairs), inter, h, stream_);
  GroupedGemm down;
  down.weights = D.expert_down.data();
  down.input = h;
  down.out = y;
  down.out_rows = hidden;
  down.in_cols = inter;
  if (one_token && combined_gemv_supported(n, k)) {
    grouped_gemm_combined(down, p, k, disabled, delta, stream_);
    return false;
  }
  if (wide) {  // y's floats hold the bf16 rows twice over
    const bool into_residual = next_norm.weight != nullptr;
    down.out = nullptr;
    down.out_bf16 = reinterpret_cast<uint16_t*>(y);
    product(down);
    combine_pairs(down.out_bf16, p, n, k, hidden, disabled, into_residual ? x_.data() : delta,
                  next_norm, stream_);
    return into_residual;
  }
  product(down);
  combine_pairs(y, p, n, k, hidden, disabled, delta, stream_);
  return false;
}

void CudaBackend::record_routing(int layer, const StepPlan& plan, KvLayout& layout,
                                 const int32_t* experts) const {
  const ModelSpec& s = weights_->spec();
  for (int t = 0; t < plan.batch.size(); ++t) {
    for (int h = 0; h < s.num_kv_heads; ++h) {
      layout.table(plan.batch.seq[t], layer, h).meta[plan.slot(layer, t, h)].expert =
          static_cast<int16_t>(experts[static_cast<size_t>(t) * s.top_k]);
    }
  }
}

void CudaBackend::host_routed_experts(int layer, int moe_index, const StepPlan& plan,
                                      KvLayout& layout, ForwardObserver* observer,
                                      const int32_t* experts_d, const float* gates_d, float* y,
                                      float* delta) {
  const ForwardBatch& batch = plan.batch;
  const ModelSpec& s = weights_->spec();
  const DeviceLayer& D = weights_->layer(layer);
  const int n = batch.size(), hidden = s.hidden_size, E = s.num_experts, k = s.top_k;
  const float* logits = router_logits_.data();
  std::vector<int32_t> experts(static_cast<size_t>(n) * k);
  std::vector<float> gates(experts.size());
  EKVA_CUDA_CHECK(cudaMemcpyAsync(experts.data(), experts_d, experts.size() * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream_));
  EKVA_CUDA_CHECK(cudaMemcpyAsync(gates.data(), gates_d, gates.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_));
  std::vector<float> host_logits;
  if (observer != nullptr) {
    host_logits.resize(static_cast<size_t>(n) * E);
    EKVA_CUDA_CHECK(cudaMemcpyAsync(host_logits.data(), logits, host_logits.size() * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
  }
  EKVA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (observer != nullptr) observer->on_router_logits(layer, moe_index, host_logits.data(), n, E);

  record_routing(layer, plan, layout, experts.data());
  std::vector<std::vector<int32_t>> rows(E);
  std::vector<std::vector<float>> row_gates(E);
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < k; ++i) {
      rows[experts[static_cast<size_t>(t) * k + i]].push_back(t);
      row_gates[experts[static_cast<size_t>(t) * k + i]].push_back(
          gates[static_cast<size_t>(t) * k + i]);
    }
  }
  if (observer != nullptr && !observer->reads_kv()) {
    observer->on_layer_routed(layer, batch, layout, nullptr, nullptr, experts.data(), gates.data(),
                              k);
  } else if (observer != nullptr) {
    // The observer reads K/V and the queries on the host: a copy of every page in use and of
    // this layer's post-RoPE queries (calibration, which is not timed).
    KvPages pages(layout);
    pages.reserve(layout);
    std::vector<std::byte> pool(pages.page_bytes() * layout.page_high_water());
    std::vector<float> q(static_cast<size_t>(n) * s.q_dim());
    EKVA_CUDA_CHECK(
        cudaMemcpyAsync(pool.data(), pool_.data(), pool.size(), cudaMemcpyDeviceToHost, stream_));
    EKVA_CUDA_CHECK(cudaMemcpyAsync(q.data(), qkv_.data(), q.size() * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
    EKVA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    pages.copy_pages_from(pool);
    observer->on_layer_routed(layer, batch, layout, &pages, q.data(), experts.data(), gates.data(),
                              k);
  }
  std::vector<int32_t> sorted_rows;
  std::vector<float> sorted_gates;
  std::vector<size_t> first(E + 1, 0);
  for (int e = 0; e < E; ++e) {
    first[e] = sorted_rows.size();
    sorted_rows.insert(sorted_rows.end(), rows[e].begin(), rows[e].end());
    sorted_gates.insert(sorted_gates.end(), row_gates[e].begin(), row_gates[e].end());
  }
  first[E] = sorted_rows.size();
  int32_t* rows_d = scratch(expert_rows_, sorted_rows.size());
  float* gates_sorted_d = scratch(expert_gates_, sorted_gates.size());
  EKVA_CUDA_CHECK(cudaMemcpyAsync(rows_d, sorted_rows.data(), sorted_rows.size() * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream_));
  EKVA_CUDA_CHECK(cudaMemcpyAsync(gates_sorted_d, sorted_gates.data(),
                                  sorted_gates.size() * sizeof(float), cudaMemcpyHostToDevice,
                                  stream_));
  uint16_t* x_rows = scratch(rows_bf16_, sorted_rows.size() * hidden);
  std::vector<float> host_y;
  for (int e = 0; e < E; ++e) {
    const int m = static_cast<int>(first[e + 1] - first[e]);
    if (m == 0) continue;
    gather_rows(x_bf16_.data(), rows_d + first[e], m, hidden, x_rows, stream_);
    mlp(D.experts[e], x_rows, m, y);
    if (observer != nullptr && observer->reads_expert_outputs()) {
      host_y.resize(static_cast<size_t>(m) * hidden);
      EKVA_CUDA_CHECK(cudaMemcpyAsync(host_y.data(), y, host_y.size() * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream_));
      EKVA_CUDA_CHECK(cudaStreamSynchronize(stream_));
      observer->on_expert_output(layer, e, rows[e], row_gates[e], host_y.data(), hidden);
    }
    if (disabled_ != std::pair<int, int>{layer, e})
      scatter_add_rows(y, rows_d + first[e], gates_sorted_d + first[e], m, hidden, delta, stream_);
  }
}

std::vector<float> CudaBackend::run(const StepPlan& plan, KvLayout& layout,
                                    ForwardObserver* observer) {
  run_step(plan, layout, observer, std::nullopt);
  const size_t count = plan.logit_rows.size() * static_cast<size_t>(weights_->spec().vocab_size);
  return plan.batch.size() == 0
             ? std::vector<float>{}
             : std::vector<float>(logits_host_.data(), logits_host_.data() + count);
}

std::vector<int32_t> CudaBackend::run_tokens(const StepPlan& plan, KvLayout& layout,
                                             std::span<const TokenDraw> draws) {
  const size_t rows = plan.logit_rows.size();
  if (draws.size() != rows) {
    fail(ErrorKind::kInvalidArgument, "run_tokens: {} logit rows but {} draws", rows, draws.size());
  }
  run_step(plan, layout, nullptr, draws);
  return plan.batch.size() == 0
             ? std::vector<int32_t>{}
             : std::vector<int32_t>(tokens_host_.data(), tokens_host_.data() + rows);
}

void CudaBackend::run_step(const StepPlan& plan, KvLayout& layout, ForwardObserver* observer,
                           std::optional<std::span<const TokenDraw>> draws) {
  const ForwardBatch& batch = plan.batch;
  const DeviceModel& w = *weights_;
  const ModelSpec& s = w.spec();
  const int n = batch.size();
  const int rows = static_cast<int>(plan.logit_rows.size());
  if (n == 0) return;

  const bool scoring = std::any_of(batch.score_query.begin(), batch.score_query.end(),
                                   [](uint8_t f) { return f != 0; });
  std::vector<uint8_t> in_batch(layout.num_sequences(), 0);
  bool decode = true;
  for (int t = 0; t < n; ++t) {
    decode = decode && in_batch[batch.seq[t]] == 0;
    in_batch[batch.seq[t]] = 1;
  }
  // Other steps attend on the tensor cores in tiles of one sequence's consecutive tokens; the
  // voting tokens' scores come from the general kernel, run on them alone.
  std::vector<int32_t> tiles, voters;
  if (!decode) {
    tiles = prefill_tiles(batch.seq.data(), n);
    for (int t = 0; t < n && scoring; ++t) {
      if (batch.score_query[t] != 0) voters.push_back(t);
    }
  }

  // Step inputs: tokens, sequences, positions, slots [layer][token][kv head], logit rows, attention
  // tiles, voting tokens.
  upload_step({batch.tokens, batch.seq, batch.pos, plan.slots, plan.logit_rows, tiles, voters});
  upload_tables(layout);
  sequences_ = tokens_ + n;
  positions_ = tokens_ + 2 * n;
  slots_ = tokens_ + 3 * n;
  logit_rows_ = slots_ + plan.slots.size();
  tiles_ = logit_rows_ + rows;
  num_tiles_ = static_cast<int>(tiles.size() / 2);
  voters_ = tiles_ + tiles.size();
  num_voters_ = static_cast<int>(voters.size());
  batch_in_order_ = n == plan.num_sequences;
  for (int t = 0; t < n && batch_in_order_; ++t) batch_in_order_ = batch.seq[t] == t;
  logits_in_order_ = rows == n;
  for (int t = 0; t < rows && logits_in_order_; ++t) logits_in_order_ = plan.logit_rows[t] == t;
  const size_t rows_in_use = static_cast<size_t>(layout.page_high_water()) * layout.page_size();
  if (scoring) {
    uint8_t* flags = scratch(score_query_, n);
    EKVA_CUDA_CHECK(
        cudaMemcpyAsync(flags, batch.score_query.data(), n, cudaMemcpyHostToDevice, stream_));
    EKVA_CUDA_CHECK(cudaMemsetAsync(score_delta_.data(), 0, rows_in_use * sizeof(float), stream_));
  }
  const bool decode_kernel =
      decode && DecodeAttentionPlan::can_implement({plan.num_sequences, s.num_heads, s.num_kv_heads,
                                                    s.head_dim, layout.page_size(), scoring});
  if (decode_kernel) plan_decode_attention(plan, scoring);
  if (decode_kernel && observer == nullptr && experts_grouped(n, nullptr)) {
    forward_decode(plan, layout, scoring);
  } else {
    forward(plan, layout, observer, decode_kernel, scoring);
  }

  if (draws) {
    int32_t* tokens = scratch(drawn_, rows);
    const size_t greedy_bytes = greedy_tokens_workspace(rows, s.vocab_size);
    greedy_tokens(logits_.data(), rows, s.vocab_size,
                  zeroed_scratch(greedy_workspace_, greedy_bytes), greedy_bytes, tokens, stream_);
    if (std::any_of(draws->begin(), draws->end(),
                    [](const TokenDraw& d) { return d.temperature > 0.0f; })) {
      TokenDraw* device_draws = scratch(draws_, rows);
      EKVA_CUDA_CHECK(cudaMemcpyAsync(device_draws, draws->data(), rows * sizeof(TokenDraw),
                                      cudaMemcpyHostToDevice, stream_));
      const size_t bytes = sample_tokens_workspace(rows, s.vocab_size);
      sample_tokens(logits_.data(), rows, s.vocab_size, device_draws,
                    scratch(sample_workspace_, bytes), bytes, tokens, stream_);
    }
    EKVA_CUDA_CHECK(cudaMemcpyAsync(staging(tokens_host_, rows), tokens, rows * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, stream_));
  } else {
    const size_t logit_count = static_cast<size_t>(rows) * s.vocab_size;
    EKVA_CUDA_CHECK(cudaMemcpyAsync(staging(logits_host_, logit_count), logits_.data(),
                                    logit_count * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  if (scoring)
    add_scores(meta_.data(), score_delta_.data(), static_cast<int64_t>(rows_in_use), stream_);
  const size_t routed = static_cast<size_t>(s.num_moe_layers()) * n * std::max(s.top_k, 1);
  std::vector<int32_t> experts;
  if (!routed_on_device_.empty()) {
    experts.resize(routed);
    EKVA_CUDA_CHECK(cudaMemcpyAsync(experts.data(), experts_.data(), routed * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, stream_));
  }
  EKVA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  // Each layer's tables are its own, so the layers are recorded in parallel (see kParallelTables).
  const int routed_layers = static_cast<int>(routed_on_device_.size());
  [[maybe_unused]] const bool parallel =
      static_cast<int64_t>(routed_layers) * n * s.num_kv_heads >= kParallelTables;
#pragma omp parallel for schedule(static) if (parallel)
  for (int i = 0; i < routed_layers; ++i) {
    const auto [layer, index] = routed_on_device_[i];
    record_routing(layer, plan, layout, experts.data() + static_cast<size_t>(index) * n * s.top_k);
  }
}

void CudaBackend::forward(const StepPlan& plan, KvLayout& layout, ForwardObserver* observer,
                          bool decode_kernel, bool scoring) {
  const DeviceModel& w = *weights_;
  const ModelSpec& s = w.spec();
  const int n = plan.batch.size(), hidden = s.hidden_size;
  const int rows = static_cast<int>(plan.logit_rows.size());
  float* x = scratch(x_, static_cast<size_t>(n) * hidden);
  scratch(normed_, static_cast<size_t>(n) * hidden);
  const size_t routed = static_cast<size_t>(s.num_moe_layers()) * n * std::max(s.top_k, 1);
  scratch(experts_, routed);
  scratch(gates_, routed);
  routed_on_device_.clear();
  scratch(x_bf16_, static_cast<size_t>(n) * hidden);
  embed_rows(w.embed().data.data(), tokens_, n, hidden, x, stream_);
  rope_rotations(positions_, n, w.inv_freq().data(), s.head_dim / 2, w.attention_factor(),
                 scratch(rotations_, static_cast<size_t>(n) * (s.head_dim / 2)), stream_);
  const float eps = static_cast<float>(s.rms_eps);
  int moe_index = 0;
  // Such an observer copies each layer's rotated float32 queries (host_routed_experts).
  const bool host_reads_queries = observer != nullptr && observer->reads_kv();
  // Each residual add (of the block before) runs in the norm that follows it, or the experts'
  // sum runs both (moe_block).
  bool block_normalised = false;  // the last MoE block ran the next norm (moe_block)
  for (int l = 0; l < s.num_layers; ++l) {
    const DeviceLayer& D = w.layer(l);
    if (l == 0) {
      rms_norm(x, n, hidden, D.attn_norm.data(), eps, nullptr, x_bf16_.data(), stream_);
    } else if (!block_normalised) {
      add_rms_norm(x, delta_.data(), n, hidden, D.attn_norm.data(), eps, nullptr, x_bf16_.data(),
                   stream_);
    }
    attention_block(l, plan, decode_kernel, scoring, host_reads_queries);
    add_rms_norm(x, delta_.data(), n, hidden, D.mlp_norm.data(), eps, normed_.data(),
                 x_bf16_.data(), stream_);
    const float* next_norm =
        l + 1 < s.num_layers ? w.layer(l + 1).attn_norm.data() : w.final_norm().data();
    block_normalised = moe_block(l, moe_index, plan, layout, observer, next_norm);
    if (s.layer_is_moe[l]) ++moe_index;
  }
  if (!block_normalised) {
    add_rms_norm(x, delta_.data(), n, hidden, w.final_norm().data(), eps, nullptr, x_bf16_.data(),
                 stream_);
  }
  const uint16_t* x_rows = x_bf16_.data();
  if (!logits_in_order_) {
    uint16_t* gathered = scratch(rows_bf16_, static_cast<size_t>(rows) * hidden);
    gather_rows(x_bf16_.data(), logit_rows_, rows, hidden, gathered, stream_);
    x_rows = gathered;
  }
  float* logits = scratch(logits_, static_cast<size_t>(rows) * s.vocab_size);
  gemm_->bf16(x_rows, rows, w.lm_head().data.data(), s.vocab_size, hidden, logits);
}

void CudaBackend::forward_decode(const StepPlan& plan, KvLayout& layout, bool scoring) {
  StepShape shape;
  shape.tokens = plan.batch.size();
  shape.logit_rows = static_cast<int>(plan.logit_rows.size());
  shape.num_sequences = plan.num_sequences;
  shape.scoring = scoring;
  shape.disabled = disabled_;
  shape.batch_in_order = batch_in_order_;
  shape.logits_in_order = logits_in_order_;
  shape.one_decode_plan = decode_plans_.size() == 1;
  shape.buffers = buffers_version_;
  // Captures that read buffers since moved cannot replay.
  std::erase_if(graphs_, [&](StepGraph& g) {
    if (g.shape.buffers == buffers_version_) return false;
    cudaGraphExecDestroy(g.exec);
    return true;
  });
  auto found = std::find_if(graphs_.begin(), graphs_.end(),
                            [&](const StepGraph& g) { return g.shape == shape; });
  if (found == graphs_.end() && eager_shape_ != shape) {
    // Launch by launch; a step of this shape that moves no buffer may then be captured.
    forward(plan, layout, nullptr, true, scoring);
    if (buffers_version_ == shape.buffers) {
      eager_shape_ = shape;
    } else {
      eager_shape_.reset();
    }
    return;
  }
  if (found == graphs_.end()) {
    cudaGraph_t graph = nullptr;
    EKVA_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
    try {
      forward(plan, layout, nullptr, true, scoring);
    } catch (...) {
      capturing_ = false;
      cudaStreamEndCapture(stream_, &graph);  // ends the capture; its own error is the caught one's
      if (graph != nullptr) cudaGraphDestroy(graph);
      throw;
    }
    capturing_ = false;
    EKVA_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    EKVA_CUDA_CHECK(instantiated);
    // A server alternates among a few batch sizes; more shapes than that are not worth keeping.
    constexpr size_t kMaxGraphs = 8;
    if (graphs_.size() == kMaxGraphs) {
      cudaGraphExecDestroy(graphs_.back().exec);
      graphs_.pop_back();
    }
    graphs_.insert(graphs_.begin(), StepGraph{shape, exec, routed_on_device_});
    found = graphs_.begin();
  } else {
    std::rotate(graphs_.begin(), found, found + 1);  // the latest first
    found = graphs_.begin();
    routed_on_device_ = found->routed_on_device;
  }
  EKVA_CUDA_CHECK(cudaGraphLaunch(found->exec, stream_));
  ++graph_steps_;
}

void CudaBackend::apply(const EvictionPlan& plan, KvLayout& layout) {
  apply_all(std::span<const EvictionPlan>(&plan, 1), layout);
}

namespace {

// Pool rows of every retained slot of `seq`, layer by layer and KV head by KV head, in slot order.
std::vector<int32_t> sequence_rows(int seq, const KvLayout& layout) {
  std::vector<int32_t> rows;
  for (int l = 0; l < layout.num_layers(); ++l) {
    for (int h = 0; h < layout.num_kv_heads(); ++h) {
      const HeadTable& t = layout.table(seq, l, h);
      for (int i = 0; i < t.size(); ++i) {
        const SlotAddress a = layout.address(t, i);
        rows.push_back(a.page * layout.page_size() + a.row);
      }
    }
  }
  return rows;
}

}  // namespace

void CudaBackend::sync_scores(int seq, KvLayout& layout) {
  const std::vector<int32_t> rows = sequence_rows(seq, layout);
  if (rows.empty()) return;
  int32_t* rows_d = scratch(score_rows_, rows.size());
  float* scores_d = scratch(row_scores_, rows.size());
  EKVA_CUDA_CHECK(cudaMemcpyAsync(rows_d, rows.data(), rows.size() * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream_));
  gather_scores(meta_.data(), rows_d, static_cast<int64_t>(rows.size()), scores_d, stream_);
  std::vector<float> scores(rows.size());
  EKVA_CUDA_CHECK(cudaMemcpyAsync(scores.data(), scores_d, scores.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_));
  EKVA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  size_t i = 0;
  for (int l = 0; l < layout.num_layers(); ++l) {
    for (int h = 0; h < layout.num_kv_heads(); ++h) {
      for (TokenMeta& m : layout.table(seq, l, h).meta) m.score = scores[i++];
    }
  }
}

void CudaBackend::upload_scores(int seq, const KvLayout& layout) {
  const std::vector<int32_t> rows = sequence_rows(seq, layout);
  if (rows.empty()) return;
  std::vector<float> scores;
  scores.reserve(rows.size());
  for (int l = 0; l < layout.num_layers(); ++l) {
    for (int h = 0; h < layout.num_kv_heads(); ++h) {
      for (const TokenMeta& m : layout.table(seq, l, h).meta) scores.push_back(m.score);
    }
  }
  int32_t* rows_d = scratch(score_rows_, rows.size());
  float* scores_d = scratch(row_scores_, rows.size());
  EKVA_CUDA_CHECK(cudaMemcpyAsync(rows_d, rows.data(), rows.size() * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream_));
  EKVA_CUDA_CHECK(cudaMemcpyAsync(scores_d, scores.data(), scores.size() * sizeof(float),
                                  cudaMemcpyHostToDevice, stream_));
  scatter_scores(meta_.data(), rows_d, scores_d, static_cast<int64_t>(rows.size()), stream_);
}

void CudaBackend::evict_on_device(std::span<const EvictionPlan> plans,
                                  const std::vector<uint8_t>& on_host,
                                  const std::vector<size_t>& listed_at,
                                  const std::vector<size_t>& pinned_at, const KvLayout& layout,
                                  std::vector<TableEviction>& evicted) {
  const int H = layout.num_kv_heads(), S = layout.num_sequences();
  const int max_evictions = kMaxDecodeEvictions;
  const int num_plans = static_cast<int>(plans.size());
  const size_t count = listed_at.back();
  // Device and staging alike: the parameters, the pinned positions (or a placeholder), then the
  // evicted slots of each segment and each one's count.
  const size_t params_size = count * kDecodeEvictParams;
  const size_t out = params_size + std::max<size_t>(pinned_at.back(), 1);
  const size_t total = out + count * (max_evictions + 1);
  int32_t* ints = scratch(eviction_ints_, total);
  int32_t* host = staging(eviction_host_, total);
  std::vector<std::pair<int, int>> listed(count);  // (plan, segment) of each listed segment
  // Each plan writes its own stretch of the staging (see kParallelTables).
  [[maybe_unused]] const bool parallel = static_cast<int64_t>(count) >= kParallelTables;
#pragma omp parallel for schedule(static) if (parallel)
  for (int p = 0; p < num_plans; ++p) {
    if (on_host[p] != 0) continue;
    size_t j = listed_at[p];
    size_t pin = pinned_at[p];
    const EvictionPlan& plan = plans[p];
    for (size_t i = 0; i < plan.segments.size(); ++i) {
      const SegmentEviction& e = plan.segments[i];
      const int size = layout.table(plan.seq, e.layer, e.kv_head).size();
      if (size <= e.keep) continue;
      const size_t at = table_at_[e.layer];
      const int segment = plan.seq * H + e.kv_head;
      const int32_t params[kDecodeEvictParams] = {
          static_cast<int32_t>(at + 2 * static_cast<size_t>(S) * H + 1) + tables_[at + segment],
          size,
          e.keep,
          e.sinks,
          e.recent_from,
          static_cast<int32_t>(pin),
          static_cast<int32_t>(pin + e.pinned.size()),
          static_cast<int32_t>(at + static_cast<size_t>(S) * H + 1) + segment};
      std::copy(params, params + kDecodeEvictParams, host + j * kDecodeEvictParams);
      std::copy(e.pinned.begin(), e.pinned.end(), host + params_size + pin);
      listed[j] = {p, static_cast<int>(i)};
      ++j;
      pin += e.pinned.size();
    }
  }
  EKVA_CUDA_CHECK(
      cudaMemcpyAsync(ints, host, out * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  DecodeEvictions e;
  e.params = ints;
  e.pinned = ints + params_size;
  e.count = static_cast<int>(count);
  e.max_evictions = max_evictions;
  e.evicted = ints + out;
  e.num_evicted = ints + out + count * max_evictions;
  evict_decode(pool_.data(), meta_.data(), ints_.data(), layout.page_size(), layout.head_dim(), e,
               stream_);
  const int32_t* result = host + out;
  EKVA_CUDA_CHECK(cudaMemcpyAsync(host + out, e.evicted, (total - out) * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream_));
  EKVA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (size_t j = 0; j < count; ++j) {
    const int n = result[count * max_evictions + j];
    if (n < 0) {  // apply_all lists only segments within max_evictions of their keep
      fail(ErrorKind::kInvalidArgument, "decode eviction: segment {} needs more than {} evictions",
           j, max_evictions);
    }
    if (n == 0) continue;
    const EvictionPlan& plan = plans[listed[j].first];
    const SegmentEviction& s = plan.segments[listed[j].second];
    evicted.push_back({plan.seq, s.layer, s.kv_head, result + j * max_evictions, n});
  }
}

void CudaBackend::apply_all(std::span<const EvictionPlan> plans, KvLayout& layout) {
  // Selections read and pool each plan's own sequence only, so all are made before any
  // compaction, and the host mirror follows, plan by plan. A segment a decode step outgrew by a few
  // slots is selected and compacted on the device in one launch for all of them, over the scores
  // there; a plan with group quotas or score pooling, or that evicts more (a prompt's
  // compression), is selected on the host over the scores sync_scores brought there, whose pooled
  // values then go back to the device, and its flagged slots are compacted a layer at a time.
  upload_tables(layout);
  const int num_plans = static_cast<int>(plans.size());
  // Per plan: whether the host selects it, else how many segments the device selects and how
  // many pinned positions they carry, summed into each plan's offsets below.
  std::vector<uint8_t> on_host(plans.size(), 0);
  std::vector<size_t> listed_at(plans.size() + 1, 0), pinned_at(plans.size() + 1, 0);
  int64_t segments = 0;
  for (const EvictionPlan& plan : plans) segments += static_cast<int64_t>(plan.segments.size());
  [[maybe_unused]] const bool parallel = segments >= kParallelTables;
#pragma omp parallel for schedule(static) if (parallel)
  for (int p = 0; p < num_plans; ++p) {
    const EvictionPlan& plan = plans[p];
    bool device = plan.pool_kernel <= 1;
    size_t listed = 0, pinned = 0;
    for (const SegmentEviction& e : plan.segments) {
      const int size = layout.table(plan.seq, e.layer, e.kv_head).size();
      device = device && e.quota.empty() && size - e.keep <= kMaxDecodeEvictions;
      if (size > e.keep) {
        ++listed;
        pinned += e.pinned.size();
      }
    }
    on_host[p] = static_cast<uint8_t>(!device);
    listed_at[p + 1] = device ? listed : 0;
    pinned_at[p + 1] = device ? pinned : 0;
  }
  std::partial_sum(listed_at.begin(), listed_at.end(), listed_at.begin());
  std::partial_sum(pinned_at.begin(), pinned_at.end(), pinned_at.begin());
  std::vector<std::vector<std::vector<int32_t>>> slots(plans.size());  // host-selected plans
  std::vector<int32_t> host_rows;
  for (size_t p = 0; p < plans.size(); ++p) {
    if (on_host[p] == 0) continue;
    const EvictionPlan& plan = plans[p];
    slots[p].resize(plan.segments.size());
    const std::vector<std::vector<uint8_t>> flags = select_plan_evictions(plan, layout);
    for (size_t i = 0; i < plan.segments.size(); ++i) {
      const SegmentEviction& e = plan.segments[i];
      const HeadTable& t = layout.table(plan.seq, e.layer, e.kv_head);
      for (int32_t slot = 0; slot < t.size(); ++slot) {
        if (flags[i][slot] == 0) continue;
        slots[p][i].push_back(slot);
        const SlotAddress a = layout.address(t, slot);
        host_rows.push_back(a.page * layout.page_size() + a.row);
      }
    }
  }
  std::vector<TableEviction> evicted;  // for the host mirror: the device's, then the host's
  if (listed_at.back() > 0) evict_on_device(plans, on_host, listed_at, pinned_at, layout, evicted);
  if (!host_rows.empty()) {
    int32_t* rows_d = scratch(score_rows_, host_rows.size());
    EKVA_CUDA_CHECK(cudaMemcpyAsync(rows_d, host_rows.data(), host_rows.size() * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream_));
    flag_rows(flags_.data(), rows_d, static_cast<int64_t>(host_rows.size()), stream_);
    std::vector<uint8_t> layer_touched(layout.num_layers(), 0);
    for (size_t p = 0; p < plans.size(); ++p) {
      for (size_t i = 0; i < plans[p].segments.size(); ++i) {
        if (on_host[p] != 0 && !slots[p][i].empty()) layer_touched[plans[p].segments[i].layer] = 1;
      }
    }
    for (int l = 0; l < layout.num_layers(); ++l) {
      if (layer_touched[l] != 0)
        evict_flagged(views_[l], flags_.data(), pool_rows_, compaction_.data(), stream_);
    }
    const size_t rows_in_use = static_cast<size_t>(layout.page_high_water()) * layout.page_size();
    EKVA_CUDA_CHECK(cudaMemsetAsync(flags_.data(), 0, rows_in_use, stream_));
  }
  for (size_t p = 0; p < plans.size(); ++p) {
    if (on_host[p] == 0) continue;
    for (size_t i = 0; i < plans[p].segments.size(); ++i) {
      if (slots[p][i].empty()) continue;
      const SegmentEviction& e = plans[p].segments[i];
      evicted.push_back({plans[p].seq, e.layer, e.kv_head, slots[p][i].data(),
                         static_cast<int>(slots[p][i].size())});
    }
  }
  layout.mirror_evictions(evicted);
  for (size_t p = 0; p < plans.size(); ++p) {
    if (on_host[p] != 0) upload_scores(plans[p].seq, layout);
  }
  EKVA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

BackendFactory cuda_backend_factory(std::shared_ptr<const DeviceModel> weights) {
  if (!weights) fail(ErrorKind::kInvalidArgument, "cuda_backend_factory: no device weights");
  return [weights](const Model& model, const KvLayout& layout) -> std::unique_ptr<Backend> {
    const ModelSpec& a = model.spec();
    const ModelSpec& b = weights->spec();
    if (a.num_layers != b.num_layers || a.hidden_size != b.hidden_size ||
        a.vocab_size != b.vocab_size || a.num_heads != b.num_heads ||
        a.num_kv_heads != b.num_kv_heads || a.head_dim != b.head_dim ||
        a.num_experts != b.num_experts || a.top_k != b.top_k) {
      fail(ErrorKind::kInvalidArgument,
           "{}: the model's shape is not that of the weights on the device", model.dir().string());
    }
    return std::make_unique<CudaBackend>(weights, layout);
  };
}

BackendFactory cuda_backend_factory() {
  struct Uploaded {
    std::mutex mutex;  // engines may be made on several threads (an evaluation's jobs)
    const Model* model = nullptr;
    std::shared_ptr<const DeviceModel> weights;
  };
  auto uploaded = std::make_shared<Uploaded>();
  return [uploaded](const Model& model, const KvLayout& layout) -> std::unique_ptr<Backend> {
    const std::lock_guard<std::mutex> lock(uploaded->mutex);
    if (uploaded->model != &model) {
      uploaded->weights.reset();  // free the previous model's weights first
      uploaded->weights =
          std::make_shared<const DeviceModel>(model, kv_pool_device_bytes(checked(layout)));
      uploaded->model = &model;
    }
    return std::make_unique<CudaBackend>(uploaded->weights, layout);
  };
}

}  // namespace ekva::cuda
