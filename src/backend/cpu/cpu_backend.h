#pragma once
// The CPU backend: the reference every other backend is checked against. float32 activations,
// weights read in their stored dtype in place (converted on the fly), K/V in host pages.
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "arch/router.h"
#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "model/model.h"

namespace ekva::cpu {

class CpuBackend : public Backend {
 public:
  CpuBackend(const Model& model, const KvLayout& layout);

  std::unique_ptr<Backend> clone() const override { return std::make_unique<CpuBackend>(*this); }
  std::vector<float> run(const StepPlan& plan, KvLayout& layout,
                         ForwardObserver* observer) override;
  void apply(const EvictionPlan& plan, KvLayout& layout) override;
  void disable_expert(int layer, int expert) override { disabled_ = {layer, expert}; }
  const KvPages* host_pages() const override { return &pages_; }

  const KvPages& pages() const { return pages_; }

 private:
  void attention_block(int layer, const StepPlan& plan, KvLayout& layout, const float* x,
                       float* out);
  void moe_block(int layer, int moe_index, const StepPlan& plan, KvLayout& layout, const float* x,
                 float* out, ForwardObserver* observer);

  const Model* model_;
  Rope rope_;
  std::optional<Router> router_;  // MoE models only
  KvPages pages_;
  std::vector<float> q_;  // the current layer's post-RoPE queries, for observers
  std::pair<int, int> disabled_{-1, -1};
};

}  // namespace ekva::cpu
