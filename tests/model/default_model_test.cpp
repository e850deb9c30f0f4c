// The embedded default model (models/ekva-moe-8m) against transformers' MixtralForCausalLM on the
// same exported weights: tests/fixtures/ekva-moe-8m/reference.safetensors was written on the GPU
// machine by tools/train_moe.py (float32 eager forward on the CPU, transformers 5.17.0).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "io/safetensors.h"
#include "model/forward.h"
#include "model/generate.h"

namespace ekva {
namespace {

const std::string kModelDir = std::string(EKVA_FIXTURES) + "/../../models/ekva-moe-8m";
const std::string kReference = std::string(EKVA_FIXTURES) + "/ekva-moe-8m/reference.safetensors";

double max_abs_difference(const float* a, const float* b, size_t n) {
  double err = 0;
  for (size_t i = 0; i < n; ++i) err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
  return err;
}

std::vector<int32_t> ids_of(const TensorView& t) {
  const auto* p = static_cast<const int64_t*>(t.data);
  return std::vector<int32_t>(p, p + t.numel());
}

TEST(DefaultModel, LogitsAndRouterLogitsMatchTransformers) {
  const auto model = Model::load(kModelDir);
  const ModelSpec& s = model->spec();
  SafetensorsFile ref(kReference);
  const TensorView& ids = ref.get("input_ids");
  const int B = static_cast<int>(ids.shape[0]), T = static_cast<int>(ids.shape[1]);
  const std::vector<int32_t> tokens = ids_of(ids);
  KvCache cache(s, B);
  ForwardBatch batch;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) batch.add(tokens[b * T + t], b, t);
  }
  RouterLogitsRecorder capture;
  const std::vector<float> logits = Forward(*model, cache).run(batch, &capture);
  const TensorView& want = ref.get("logits");
  ASSERT_EQ(static_cast<size_t>(want.numel()), logits.size());
  // Logits reach about 25 in magnitude; float32 summation order alone moves them ~1e-5.
  EXPECT_LE(max_abs_difference(logits.data(), static_cast<const float*>(want.data), logits.size()),
            2e-3);
  ASSERT_EQ(static_cast<int>(capture.logits.size()), s.num_moe_layers());
  for (int i = 0; i < s.num_moe_layers(); ++i) {
    const TensorView& r = ref.get("router_logits." + std::to_string(i));
    ASSERT_EQ(static_cast<size_t>(r.numel()), capture.logits[i].size());
    EXPECT_LE(max_abs_difference(capture.logits[i].data(), static_cast<const float*>(r.data),
                                 capture.logits[i].size()),
              2e-3)
        << "router layer " << i;
  }
}

TEST(DefaultModel, GreedyGenerationMatchesTransformers) {
  const auto model = Model::load(kModelDir);
  SafetensorsFile ref(kReference);
  const std::vector<int32_t> want = ids_of(ref.get("greedy_output"));
  KvCache cache(model->spec(), 1);
  GenerateOptions options;
  options.max_new_tokens = static_cast<int>(want.size());
  options.stop_at_eos = false;
  EXPECT_EQ(generate(*model, cache, ids_of(ref.get("greedy_prompt")), options).tokens, want);
}

}  // namespace
}  // namespace ekva
