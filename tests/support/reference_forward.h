#pragma once
// The forward half of a parity test, shared by the checks against transformers: a reference file's
// input_ids [B, T] run as one ragged batch, its logits and router logits compared.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "io/safetensors.h"

namespace ekva::testing {

// max |a - b| relative to max |b|
inline double relative_error(const float* a, const float* b, size_t n) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return err / scale;
}

inline std::vector<int32_t> token_ids(const TensorView& t) {
  const auto* p = static_cast<const int64_t*>(t.data);
  return std::vector<int32_t>(p, p + t.numel());
}

inline void expect_forward_matches(const Model& model, const SafetensorsFile& ref,
                                   double tolerance) {
  const ModelSpec& s = model.spec();
  const TensorView& ids = ref.get("input_ids");
  const int B = static_cast<int>(ids.shape[0]), T = static_cast<int>(ids.shape[1]);
  const std::vector<int32_t> tokens = token_ids(ids);
  EngineOptions options;
  options.num_sequences = B;
  Engine engine(model, options);
  ForwardBatch batch;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) batch.add(tokens[b * T + t], b, t);
  }
  RouterLogitsRecorder capture;
  const std::vector<float> logits = engine.step(batch, &capture);
  const TensorView& want = ref.get("logits");
  ASSERT_EQ(static_cast<size_t>(want.numel()), logits.size());
  EXPECT_LE(relative_error(logits.data(), static_cast<const float*>(want.data), logits.size()),
            tolerance);
  ASSERT_EQ(static_cast<int>(capture.logits.size()), s.num_moe_layers());
  for (int i = 0; i < s.num_moe_layers(); ++i) {
    const TensorView& r = ref.get("router_logits." + std::to_string(i));
    ASSERT_EQ(static_cast<size_t>(r.numel()), capture.logits[i].size());
    EXPECT_LE(relative_error(capture.logits[i].data(), static_cast<const float*>(r.data),
                             capture.logits[i].size()),
              tolerance)
        << "router layer " << i;
  }
}

}  // namespace ekva::testing
