#pragma once
// Each `ekva` subcommand registers itself on the app; only the CLI prints or exits.
#include <CLI/CLI.hpp>
#include <functional>

namespace ekva::cli {

// The action a subcommand runs after parsing; returns the process exit code.
using Action = std::function<int()>;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;  // for sizes the CLI prints and reads in GiB

void add_info(CLI::App& app, Action& action);
void add_forward(CLI::App& app, Action& action);
void add_generate(CLI::App& app, Action& action);
void add_tokenize(CLI::App& app, Action& action);
void add_detokenize(CLI::App& app, Action& action);
void add_roofline(CLI::App& app, Action& action);
void add_tasks(CLI::App& app, Action& action);
void add_calibrate(CLI::App& app, Action& action);
void add_plan(CLI::App& app, Action& action);
void add_eval(CLI::App& app, Action& action);
void add_demo(CLI::App& app, Action& action);
void add_bench(CLI::App& app, Action& action);
void add_serve(CLI::App& app, Action& action);
void add_loadgen(CLI::App& app, Action& action);

}  // namespace ekva::cli
