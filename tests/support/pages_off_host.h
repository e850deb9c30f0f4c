#pragma once
// The CPU backend with its pages hidden: a backend that keeps K/V off the host, as the CUDA one
// does, so that what the engine refuses there is checked on machines without a GPU.
#include <memory>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace ekva::testing {

class PagesOffHost : public Backend {
 public:
  explicit PagesOffHost(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::unique_ptr<Backend> clone() const override {
    return std::make_unique<PagesOffHost>(inner_->clone());
  }
  std::vector<float> run(const StepPlan& plan, KvLayout& layout,
                         ForwardObserver* observer) override {
    return inner_->run(plan, layout, observer);
  }
  void apply(const EvictionPlan& plan, KvLayout& layout) override { inner_->apply(plan, layout); }
  void disable_expert(int layer, int expert) override { inner_->disable_expert(layer, expert); }

 private:
  std::unique_ptr<Backend> inner_;
};

// A factory for EngineOptions::backend.
inline BackendFactory pages_off_host() {
  return [](const Model& model, const KvLayout& layout) -> std::unique_ptr<Backend> {
    return std::make_unique<PagesOffHost>(std::make_unique<cpu::CpuBackend>(model, layout));
  };
}

}  // namespace ekva::testing
