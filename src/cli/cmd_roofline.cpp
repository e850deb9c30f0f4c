#include <fmt/core.h>

#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_file.h"
#include "io/model_config.h"
#include "kv/budget_plan.h"
#include "roofline/cost_model.h"
#include "roofline/measured.h"
#include "roofline/memory_model.h"
#include "roofline/report.h"
#include "roofline/search.h"
#include "roofline/serving.h"
#include "roofline/svg_chart.h"

namespace ekva::cli {
namespace {

// Options both `ekva roofline` and `ekva roofline search` take.
struct CommonArgs {
  std::string model;
  std::string hw;
  std::string hw_file;
  int64_t context = 0;
  std::string kv_dtype = "bf16";
  std::string weight_dtype;  // empty: the checkpoint's dtype
  std::string routing;
  bool datasheet = false;
  double workspace_gib = 1.0;
  bool json = false;
};

struct PredictArgs {
  CommonArgs common;
  int64_t batch = 1;
  std::string phase = "decode";
  std::string plan;
  std::string svg;
  std::string measured;
  bool per_layer = false;
  bool list_hw = false;
};

struct SearchArgs {
  CommonArgs common;
  double max_time_per_token = 0;
  double min_throughput = 0;
  double memory_cap_gib = 0;
  std::vector<double> fractions;
  int64_t batch_limit = 4096;
  double knee_threshold = 0.05;
};

struct ServePredictionArgs {
  CommonArgs common;
  double kv_memory = 0;
  int64_t prompt_tokens = 0;
  int64_t max_tokens = 64;
  std::vector<double> budgets{1.0, 0.5, 0.2, 0.1};
  int page_size = 16;
  int64_t max_sequences = 0;
};

void add_common(CLI::App* cmd, CommonArgs& a) {
  cmd->add_option("--model", a.model, "Model directory or config.json alone");
  cmd->add_option("--hw", a.hw,
                  "Hardware: a name in data/hardware (h200, a100-80gb, ...) or a path to a JSON "
                  "file");
  cmd->add_option("--hw-file", a.hw_file, "Hardware spec JSON file (schema in docs/ROOFLINE.md)");
  cmd->add_option("--context", a.context,
                  "Decode: tokens in each sequence's context; prefill: prompt length");
  cmd->add_option("--kv-dtype", a.kv_dtype, "KV cache format: bf16, f16, fp8, int8, int4, f32")
      ->capture_default_str();
  cmd->add_option("--weight-dtype", a.weight_dtype,
                  "Weight format (default: the checkpoint's): bf16, f16, fp8, int8, int4, f32");
  cmd->add_option("--routing", a.routing,
                  "Measured routing: calibration statistics (ekva calibrate) or JSON "
                  "{\"expert_counts\": [[...], ...]}; default uniform routing");
  cmd->add_flag("--datasheet", a.datasheet, "Ignore the measured profile of the hardware file");
  cmd->add_option("--workspace-gib", a.workspace_gib,
                  "Memory reserved for the runtime and GEMM workspaces")
      ->capture_default_str();
  cmd->add_flag("--json", a.json, "Print one JSON object");
}

HardwareSpec resolve_hardware(const CommonArgs& a) {
  if (!a.hw.empty() && !a.hw_file.empty()) {
    fail(ErrorKind::kInvalidArgument, "give --hw or --hw-file, not both");
  }
  if (!a.hw_file.empty()) return load_hardware_file(a.hw_file);
  if (a.hw.empty()) fail(ErrorKind::kInvalidArgument, "--hw or --hw-file is required");
  return find_hardware(a.hw);
}

// The workload parts both commands share; batch, phase and retention are set by the caller.
Workload base_workload(const ModelSpec& spec, const CommonArgs& a) {
  if (a.model.empty()) fail(ErrorKind::kInvalidArgument, "--model is required");
  Workload w;
  w.context = a.context;
  w.kv_format = parse_number_format(a.kv_dtype, "--kv-dtype");
  if (!a.weight_dtype.empty()) {
    w.weight_format = parse_number_format(a.weight_dtype, "--weight-dtype");
  } else if (spec.weight_dtype == DType::kF32) {
    w.weight_format = NumberFormat::kF32;
  } else if (spec.weight_dtype == DType::kF16) {
    w.weight_format = NumberFormat::kF16;
  } else {
    w.weight_format = NumberFormat::kBF16;
  }
  // Kernels compute in bf16 unless the checkpoint is float32 (the tiny test models).
  w.activation_format =
      w.weight_format == NumberFormat::kF32 ? NumberFormat::kF32 : NumberFormat::kBF16;
  if (!a.routing.empty()) w.routing = RoutingModel::load(a.routing, spec);
  return w;
}

MemoryOptions memory_options(const CommonArgs& a) {
  MemoryOptions m;
  m.workspace_bytes = a.workspace_gib * kGiB;
  return m;
}

std::string model_line(const ModelSpec& s, const Workload& w) {
  return fmt::format(
      "{}: {} layers ({} MoE), {} experts top-{}, {} q / {} KV heads of {}, "
      "weights {}, KV {}",
      s.model_type, s.num_layers, s.num_moe_layers(), s.num_experts, s.top_k, s.num_heads,
      s.num_kv_heads, s.head_dim, number_format_name(w.weight_format),
      number_format_name(w.kv_format));
}

std::string hardware_line(const HardwareSpec& hw, const Ceilings& c, bool datasheet) {
  return fmt::format(
      "{} ({}): read {:.0f} GB/s, write {:.0f} GB/s, bf16 {:.1f} TFLOP/s, fp32 {:.1f} "
      "TFLOP/s, {:.1f} GiB; {}",
      hw.name, hw.description, c.read_bandwidth / 1e9, c.write_bandwidth / 1e9,
      c.peak(PeakFormat::kBF16) / 1e12, c.peak(PeakFormat::kFP32) / 1e12, hw.memory_bytes / kGiB,
      hw.measured && !datasheet ? "measured profile" : "datasheet ceilings");
}

void print_table(const std::vector<OperatorCost>& rows, const StepCost& totals, bool per_layer) {
  fmt::print("{:<17} {:>5} {:>5} {:>11} {:>10} {:>10} {:>10} {:>10} {:>9} {:>7} {:>11} {:>6}\n",
             "operator", "layer", "rows", "GFLOP", "weight MB", "act MB", "KV rd MB", "KV wr MB",
             "FLOP/B", "bound", "time us", "share");
  const auto line = [&](const std::string& name, const std::string& layer, int count, double flops,
                        double weight, double act, double kv_read, double kv_write, double bytes,
                        const std::string& bound, double time) {
    fmt::print(
        "{:<17} {:>5} {:>5} {:>11.3f} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>9.2f} {:>7} "
        "{:>11.2f} {:>5.1f}%\n",
        name, layer, count, flops / 1e9, weight / 1e6, act / 1e6, kv_read / 1e6, kv_write / 1e6,
        bytes > 0 ? flops / bytes : 0.0, bound, time * 1e6,
        totals.time_s > 0 ? 100 * time / totals.time_s : 0.0);
  };
  for (const auto& r : rows) {
    line(std::string(operator_name(r.kind)),
         per_layer && r.layer >= 0 ? std::to_string(r.layer) : "", r.count, r.flops, r.weight_bytes,
         r.activation_read_bytes + r.activation_write_bytes, r.kv_read_bytes, r.kv_write_bytes,
         r.bytes(), std::string(bound_name(r.bound)), r.time_s);
  }
  int count = 0;
  for (const auto& r : rows) count += r.count;
  line("total", "", count, totals.flops, totals.weight_bytes, totals.activation_bytes,
       totals.kv_read_bytes, totals.kv_write_bytes, totals.bytes,
       std::string(bound_name(totals.bound)), totals.time_s);
}

int run_predict(const PredictArgs& a) {
  if (a.list_hw) {
    for (const auto& name : list_hardware_names()) {
      const HardwareSpec hw = find_hardware(name);
      fmt::print("{:<14} {}{}\n", name, hw.description, hw.measured ? " (measured profile)" : "");
    }
    return 0;
  }
  if (!a.svg.empty()) check_output_file(a.svg);
  const CommonArgs& c = a.common;
  if (c.model.empty()) fail(ErrorKind::kInvalidArgument, "--model is required");
  const ModelSpec spec = load_model_config(c.model);
  const HardwareSpec hw = resolve_hardware(c);
  Workload w = base_workload(spec, c);
  w.phase = parse_phase(a.phase, "--phase");
  w.batch = a.batch;
  if (w.phase == Phase::kPrefill && w.context < 1) {
    fail(ErrorKind::kInvalidArgument, "--context (the prompt length) is required for prefill");
  }
  std::string retention = "full KV";
  if (!a.plan.empty()) {
    const BudgetPlan plan = BudgetPlan::load(a.plan);
    w.retained = KvRetention::from_plan(spec, plan, w.context);
    retention = fmt::format("plan {}", a.plan);
  } else {
    w.retained = KvRetention::full(spec, w.context);
  }
  std::optional<MeasuredTimes> measured;
  if (!a.measured.empty()) measured = load_measured_times(a.measured);
  RooflineReport report = make_roofline_report(spec, hw, w, c.datasheet, memory_options(c),
                                               measured ? &*measured : nullptr);
  report.model_source = c.model;
  report.routing_source = c.routing;
  report.retention = retention;
  const StepCost& step = report.step;
  const MemoryUse& memory = report.memory;
  const auto params = spec.parameters();
  if (!a.svg.empty()) {
    const std::string title =
        fmt::format("{} on {}: {} batch {} context {} ({})", spec.model_type, hw.name,
                    phase_name(w.phase), w.batch, w.context, retention);
    write_text_file(a.svg, roofline_svg(title, report.ceilings, gemm_peak_format(w.weight_format),
                                        roofline_chart_points(report)));
  }

  if (c.json) {
    fmt::print("{}\n", roofline_report_json(report).dump(2));
    return 0;
  }

  fmt::print("model     {}\n", model_line(spec, w));
  fmt::print("hardware  {}\n", hardware_line(hw, report.ceilings, c.datasheet));
  fmt::print("workload  {}, batch {}, context {}, {} ({:.1f}% of the context kept), {} routing\n\n",
             phase_name(w.phase), w.batch, w.context, retention, 100 * report.retained_fraction,
             w.routing.is_uniform() ? "uniform" : "measured");
  print_table(a.per_layer ? step.operators : report.by_operator, step, a.per_layer);
  fmt::print("\nstep time          {:.2f} us ({}-bound), {:.0f} tokens/s\n", step.time_s * 1e6,
             bound_name(step.bound), report.tokens_per_s);
  fmt::print(
      "time split         weights {:.1f}%, KV {:.1f}%, activations {:.1f}%, compute {:.1f}%, "
      "per-call latency {:.1f}%\n",
      100 * step.weight_time_s / step.time_s, 100 * step.kv_time_s / step.time_s,
      100 * step.activation_time_s / step.time_s, 100 * step.compute_time_s / step.time_s,
      100 * step.latency_time_s / step.time_s);
  fmt::print("KV bytes per token {:.0f} (full, {}); {:.3f} MiB per sequence as kept\n",
             report.kv_per_token, number_format_name(w.kv_format),
             report.kv_per_sequence / (1024.0 * 1024.0));
  fmt::print("parameters         {} total, {} active per token\n", params.total,
             params.active_per_token);
  fmt::print("experts touched    {:.2f} per MoE layer of {} (tokens per step {:.0f})\n",
             step.mean_experts_touched(), spec.num_experts, step.tokens);
  fmt::print(
      "memory             weights {:.2f} GiB + KV {:.2f} GiB + activations {:.2f} GiB + "
      "workspace {:.2f} GiB = {:.2f} GiB of {:.2f} GiB ({}); largest batch {}\n",
      memory.weight_bytes / kGiB, memory.kv_bytes / kGiB, memory.activation_bytes / kGiB,
      memory.workspace_bytes / kGiB, memory.total_bytes / kGiB, memory.capacity_bytes / kGiB,
      memory.fits() ? "fits" : "does not fit", report.largest_batch);
  const std::vector<PredictionError>& errors = report.errors;
  if (!errors.empty()) {
    fmt::print("\n{:<40} {:>13} {:>13} {:>9}\n", "measured", "measured us", "predicted us",
               "error");
    double abs_sum = 0;
    for (const auto& e : errors) {
      fmt::print("{:<40} {:>13.2f} {:>13.2f} {:>+8.1f}%\n", measured_label(e.measured),
                 e.measured.time_s * 1e6, e.predicted_s * 1e6, 100 * e.error);
      abs_sum += std::abs(e.error);
    }
    fmt::print("mean absolute error {:.1f}% over {} measurements\n",
               100 * abs_sum / static_cast<double>(errors.size()), errors.size());
  }
  if (!a.svg.empty()) fmt::print("\nwrote {}\n", a.svg);
  return 0;
}

int run_search(const SearchArgs& a) {
  const CommonArgs& c = a.common;
  if (c.model.empty()) fail(ErrorKind::kInvalidArgument, "--model is required");
  const ModelSpec spec = load_model_config(c.model);
  const HardwareSpec hw = resolve_hardware(c);
  if (c.context < 1) fail(ErrorKind::kInvalidArgument, "--context is required");
  const Workload base = base_workload(spec, c);
  const int targets = (a.max_time_per_token > 0) + (a.min_throughput > 0) + (a.memory_cap_gib > 0);
  if (targets != 1) {
    fail(ErrorKind::kInvalidArgument,
         "give exactly one target: --max-time-per-token S, --min-throughput TOKENS_PER_S or "
         "--memory-cap-gib GIB");
  }
  SearchTarget target;
  if (a.max_time_per_token > 0) {
    target = {TargetKind::kMaxTimePerToken, a.max_time_per_token};
  } else if (a.min_throughput > 0) {
    target = {TargetKind::kMinThroughput, a.min_throughput};
  } else {
    target = {TargetKind::kMemoryCap, a.memory_cap_gib * kGiB};
  }
  SearchOptions options;
  options.fractions = a.fractions;
  for (double f : options.fractions) {
    if (!(f > 0) || f > 1) fail(ErrorKind::kInvalidArgument, "--fractions: {} is not in (0, 1]", f);
  }
  options.batch_limit = a.batch_limit;
  options.knee_threshold = a.knee_threshold;
  options.memory = memory_options(c);
  options.datasheet_only = c.datasheet;
  const SearchResult r = search_kv_budget(spec, hw, base, target, options);

  if (c.json) {
    nlohmann::json points = nlohmann::json::array();
    for (const auto& p : r.points) {
      points.push_back({{"kv_fraction", p.kv_fraction},
                        {"kv_bytes_per_sequence", p.kv_bytes_per_sequence},
                        {"feasible", p.feasible},
                        {"batch", p.batch},
                        {"memory_batch", p.memory_batch},
                        {"time_s", p.time_s},
                        {"tokens_per_s", p.tokens_per_s},
                        {"gain_over_full", p.gain_over_full},
                        {"limited_by", p.limited_by},
                        {"bound", std::string(bound_name(p.step.bound))},
                        {"memory", memory_json(p.memory, p.memory_batch)}});
    }
    const auto point_or_null = [&](int i) {
      return i < 0 ? nlohmann::json(nullptr) : points[static_cast<size_t>(i)];
    };
    nlohmann::json j = {
        {"model", c.model},
        {"hardware", hw.name},
        {"context", c.context},
        {"kv_dtype", std::string(number_format_name(base.kv_format))},
        {"target", {{"kind", std::string(target_kind_name(target.kind))}, {"value", target.value}}},
        {"points", points},
        {"chosen", point_or_null(r.chosen)},
        {"knee", point_or_null(r.knee)},
        {"knee_dominated_by", r.knee_dominated_by}};
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("model     {}\n", model_line(spec, base));
  fmt::print("hardware  {}\n", hardware_line(hw, hw.ceilings(c.datasheet), c.datasheet));
  std::string target_text;
  switch (target.kind) {
    case TargetKind::kMaxTimePerToken:
      target_text = fmt::format("at most {:.3f} ms per decode step (per token of a sequence)",
                                target.value * 1e3);
      break;
    case TargetKind::kMinThroughput:
      target_text = fmt::format("at least {:.0f} generated tokens/s", target.value);
      break;
    case TargetKind::kMemoryCap:
      target_text = fmt::format("at most {:.2f} GiB of memory", target.value / kGiB);
      break;
  }
  fmt::print("target    {}, context {}, decode\n\n", target_text, c.context);
  fmt::print("{:>9} {:>12} {:>6} {:>7} {:>10} {:>12} {:>9} {:>8} {:>12}  {}\n", "KV frac",
             "KV MiB/seq", "batch", "mem max", "step ms", "tokens/s", "vs full", "bound",
             "limited by", "");
  for (size_t i = 0; i < r.points.size(); ++i) {
    const SearchPoint& p = r.points[i];
    std::string mark;
    if (static_cast<int>(i) == r.chosen) mark += " <- largest budget meeting the target";
    if (static_cast<int>(i) == r.knee) mark += " <- knee";
    fmt::print("{:>9.4f} {:>12.2f} {:>6} {:>7} {:>10.3f} {:>12.0f} {:>9} {:>8} {:>12} {}{}\n",
               p.kv_fraction, p.kv_bytes_per_sequence / (1024.0 * 1024.0),
               p.feasible ? std::to_string(p.batch) : "-", p.memory_batch, p.time_s * 1e3,
               p.tokens_per_s,
               p.gain_over_full > 0 ? fmt::format("{:.2f}x", p.gain_over_full) : "-",
               bound_name(p.step.bound), p.feasible ? p.limited_by : "infeasible", mark, "");
  }
  fmt::print("\n");
  if (r.chosen < 0) {
    fmt::print("no KV budget meets the target on {}\n", hw.name);
    return 0;
  }
  const SearchPoint& chosen = r.points[r.chosen];
  fmt::print(
      "meets the target  KV fraction {:.4f} at batch {}: {:.3f} ms per step, {:.0f} tokens/s",
      chosen.kv_fraction, chosen.batch, chosen.time_s * 1e3, chosen.tokens_per_s);
  if (r.points.front().feasible) {
    fmt::print(" ({:.2f}x full KV)\n", chosen.gain_over_full);
  } else {
    fmt::print(" (full KV cannot meet it)\n");
  }
  if (r.knee >= 0) {
    const SearchPoint& knee = r.points[r.knee];
    fmt::print(
        "knee              KV fraction {:.4f} at batch {}: {:.0f} tokens/s{}; smaller budgets "
        "gain less than {:.0f}% more, the step being dominated by {}\n",
        knee.kv_fraction, knee.batch, knee.tokens_per_s,
        knee.gain_over_full > 0 ? fmt::format(" ({:.2f}x full KV)", knee.gain_over_full) : "",
        100 * a.knee_threshold, r.knee_dominated_by);
  } else {
    fmt::print(
        "knee              none down to KV fraction {:.4f}: smaller budgets still gain more than "
        "{:.0f}%\n",
        r.points.back().kv_fraction, 100 * a.knee_threshold);
  }
  return 0;
}

int run_serve_prediction(const ServePredictionArgs& a) {
  const CommonArgs& c = a.common;
  if (c.model.empty()) fail(ErrorKind::kInvalidArgument, "--model is required");
  if (!(a.kv_memory > 0)) fail(ErrorKind::kInvalidArgument, "--kv-memory is required");
  if (a.prompt_tokens < 1) fail(ErrorKind::kInvalidArgument, "--prompt-tokens is required");
  const ModelSpec spec = load_model_config(c.model);
  const HardwareSpec hw = resolve_hardware(c);
  if (a.prompt_tokens + a.max_tokens > spec.max_position) {
    fail(ErrorKind::kInvalidArgument,
         "--prompt-tokens {} and --max-tokens {} exceed the model's context of {} (the server "
         "refuses such requests)",
         a.prompt_tokens, a.max_tokens, spec.max_position);
  }
  ServingConfig config;
  config.kv_memory_bytes = a.kv_memory;
  config.prompt_tokens = a.prompt_tokens;
  config.max_tokens = a.max_tokens;
  config.page_size = a.page_size;
  config.max_sequences = a.max_sequences;
  config.base = base_workload(spec, c);
  std::vector<ServingPrediction> points;
  for (const double budget : a.budgets) {
    if (!(budget > 0) || budget > 1) {
      fail(ErrorKind::kInvalidArgument, "--budgets: {} is not a fraction in (0, 1]", budget);
    }
    config.budget = budget;
    points.push_back(predict_serving(spec, hw, config, c.datasheet));
  }
  const auto gain = [&](size_t i) {
    return points[0].tokens_per_s > 0 ? points[i].tokens_per_s / points[0].tokens_per_s : 0.0;
  };
  if (c.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = 0; i < points.size(); ++i) {
      const ServingPrediction& p = points[i];
      const StepCost& st = p.step;
      nlohmann::json row = {
          {"budget", a.budgets[i]},     {"sequences", p.sequences},
          {"limited_by", p.limited_by}, {"admit_pages", p.admit_pages},
          {"kept_pages", p.kept_pages}, {"kv_bytes_per_sequence", p.kept_pages * p.page_bytes},
          {"context", p.context},       {"kept_tokens", p.kept_tokens},
          {"step_ms", 1e3 * st.time_s}, {"tokens_per_s", p.tokens_per_s},
          {"gain_over_full", gain(i)}};
      if (p.sequences > 0) {
        // The step at other batches, for a measured batch that differs from the predicted one.
        nlohmann::json by_batch = nlohmann::json::array();
        ServingConfig at = config;
        at.budget = a.budgets[i];
        const int64_t most = std::min<int64_t>(p.sequences + p.sequences / 2 + 8, 4096);
        for (int64_t batch = 1; batch <= most; ++batch) {
          by_batch.push_back(1e3 * serving_step(spec, hw, at, batch, c.datasheet).time_s);
        }
        row["step_ms_by_batch"] = by_batch;
        row["bound"] = std::string(bound_name(st.bound));
        row["split"] = {{"weights", st.weight_time_s / st.time_s},
                        {"kv", st.kv_time_s / st.time_s},
                        {"activations", st.activation_time_s / st.time_s},
                        {"compute", st.compute_time_s / st.time_s},
                        {"latency", st.latency_time_s / st.time_s}};
      }
      rows.push_back(row);
    }
    const nlohmann::json j = {{"model", c.model},
                              {"hardware", hw.name},
                              {"profile", hw.measured && !c.datasheet ? "measured" : "datasheet"},
                              {"kv_dtype", std::string(number_format_name(config.base.kv_format))},
                              {"kv_memory_bytes", a.kv_memory},
                              {"capacity_pages", points.empty() ? 0 : points[0].capacity_pages},
                              {"page_bytes", points.empty() ? 0.0 : points[0].page_bytes},
                              {"prompt_tokens", a.prompt_tokens},
                              {"max_tokens", a.max_tokens},
                              {"page_size", a.page_size},
                              {"max_sequences", a.max_sequences},
                              {"points", rows}};
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("model     {}\n", model_line(spec, config.base));
  fmt::print("hardware  {}\n", hardware_line(hw, hw.ceilings(c.datasheet), c.datasheet));
  fmt::print(
      "server    {:.2f} GiB of KV pages ({} of {} tokens), prompts of {} tokens, {} generated "
      "each{}\n\n",
      a.kv_memory / kGiB, points.empty() ? 0 : points[0].capacity_pages, a.page_size,
      a.prompt_tokens, a.max_tokens,
      a.max_sequences > 0 ? fmt::format(", {} sequences at most", a.max_sequences) : "");
  fmt::print("{:>7} {:>11} {:>11} {:>10} {:>10} {:>10} {:>12} {:>8} {:>8}  {}\n", "budget",
             "admit MiB", "kept MiB", "sequences", "KV read", "step ms", "tokens/s", "vs full",
             "bound", "limited by");
  for (size_t i = 0; i < points.size(); ++i) {
    const ServingPrediction& p = points[i];
    const double mib = p.page_bytes / (1024.0 * 1024.0);
    fmt::print("{:>7g} {:>11.1f} {:>11.1f} {:>10} {:>10.0f} {:>10.3f} {:>12.0f} {:>8} {:>8}  {}\n",
               a.budgets[i], static_cast<double>(p.admit_pages) * mib,
               static_cast<double>(p.kept_pages) * mib, p.sequences, p.kept_tokens,
               1e3 * p.step.time_s, p.tokens_per_s,
               gain(i) > 0 ? fmt::format("{:.2f}x", gain(i)) : "-",
               p.sequences > 0 ? std::string(bound_name(p.step.bound)) : "-", p.limited_by);
  }
  fmt::print(
      "\nA request reserves its full cache until its prompt is compressed, then what its budget "
      "keeps; once the memory is full one request is prefilled beside the others. KV read: "
      "tokens each (layer, KV head) attention reads per step, on average.\n");
  return 0;
}

}  // namespace

void add_roofline(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "roofline", "Predict per-operator time, bytes and memory of a prefill or decode step");
  auto args = std::make_shared<PredictArgs>();
  add_common(cmd, args->common);
  cmd->add_option("--batch", args->batch, "Sequences in the batch")->capture_default_str();
  cmd->add_option("--phase", args->phase, "decode or prefill")->capture_default_str();
  cmd->add_option("--plan", args->plan, "BudgetPlan JSON: the KV each (layer, KV head) keeps");
  cmd->add_option("--svg", args->svg, "Write a roofline chart with each operator as a point");
  cmd->add_option("--measured", args->measured,
                  "Measured per-operator times JSON (schema in docs/ROOFLINE.md): print the "
                  "prediction error");
  cmd->add_flag("--per-layer", args->per_layer, "One table row per layer and operator");
  cmd->add_flag("--list-hw", args->list_hw, "List the hardware files in the data directory");
  cmd->require_subcommand(0, 1);

  auto* search = cmd->add_subcommand(
      "search", "Find the KV budget and batch that meet a latency, throughput or memory target");
  auto sargs = std::make_shared<SearchArgs>();
  add_common(search, sargs->common);
  search->add_option("--max-time-per-token", sargs->max_time_per_token,
                     "Target: seconds per decode step at most");
  search->add_option("--min-throughput", sargs->min_throughput,
                     "Target: generated tokens per second at least");
  search->add_option("--memory-cap-gib", sargs->memory_cap_gib, "Target: memory at most (GiB)");
  search
      ->add_option("--fractions", sargs->fractions,
                   "KV fractions of the context to try (default 1, 2^-0.5, ..., 1/256)")
      ->delimiter(',');
  search->add_option("--batch-limit", sargs->batch_limit, "The largest batch the engine runs")
      ->capture_default_str();
  search
      ->add_option("--knee-threshold", sargs->knee_threshold,
                   "A smaller budget must gain more than this fraction to pay")
      ->capture_default_str();

  auto* serve = cmd->add_subcommand(
      "serve",
      "Predict the sequences a server's fixed KV memory holds at each budget and their decode "
      "throughput (ekva serve's admission rule)");
  auto vargs = std::make_shared<ServePredictionArgs>();
  {
    CommonArgs& c = vargs->common;
    serve->add_option("--model", c.model, "Model directory or config.json alone");
    serve->add_option("--hw", c.hw, "Hardware: a name in data/hardware or a path to a JSON file");
    serve->add_option("--hw-file", c.hw_file, "Hardware spec JSON file");
    serve->add_option("--kv-dtype", c.kv_dtype, "KV cache format (the CUDA engine stores bf16)")
        ->capture_default_str();
    serve->add_option("--routing", c.routing, "Measured routing (as for ekva roofline)");
    serve->add_flag("--datasheet", c.datasheet, "Ignore the measured profile of the hardware file");
    serve->add_flag("--json", c.json, "Print one JSON object");
  }
  serve->add_option("--kv-memory", vargs->kv_memory, "Bytes of KV pages (serve --kv-memory)");
  serve->add_option("--prompt-tokens", vargs->prompt_tokens, "Tokens per prompt");
  serve->add_option("--max-tokens", vargs->max_tokens, "Tokens generated per request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve
      ->add_option("--budgets", vargs->budgets,
                   "Comma-separated shares of the prompt each sequence keeps (1: full KV)")
      ->delimiter(',')
      ->capture_default_str();
  serve->add_option("--page-size", vargs->page_size, "Tokens per KV page")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve
      ->add_option("--max-sequences", vargs->max_sequences,
                   "The server's --max-sequences (0: no limit)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();

  cmd->callback([&action, search, serve, args, sargs, vargs] {
    if (search->parsed()) {
      action = [sargs] { return run_search(*sargs); };
    } else if (serve->parsed()) {
      action = [vargs] { return run_serve_prediction(*vargs); };
    } else {
      action = [args] { return run_predict(*args); };
    }
  });
}

}  // namespace ekva::cli
