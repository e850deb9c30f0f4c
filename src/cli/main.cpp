#include <fmt/core.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  // A spinning OpenMP team collapses when another process takes a core: each of the ~70 barriers
  // of a decode step waits a scheduler slice for a preempted thread (docs/BENCHMARKS.md, CPU
  // engine). So the team leaves the cores that the last minute's load average says are busy; an
  // explicit OMP_NUM_THREADS takes precedence.
  double load = 0.0;
  if (std::getenv("OMP_NUM_THREADS") == nullptr && getloadavg(&load, 1) == 1) {
    const int cpus = omp_get_num_procs();
    omp_set_num_threads(std::clamp(cpus - static_cast<int>(std::lround(load)), 1, cpus));
  }
  CLI::App app{"EKVA: expert-aware KV-cache budgets for Mixture-of-Experts inference"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ekva 0.1.0");
  ekva::cli::Action action;
  ekva::cli::add_info(app, action);
  ekva::cli::add_forward(app, action);
  ekva::cli::add_generate(app, action);
  ekva::cli::add_tokenize(app, action);
  ekva::cli::add_detokenize(app, action);
  ekva::cli::add_roofline(app, action);
  ekva::cli::add_tasks(app, action);
  ekva::cli::add_calibrate(app, action);
  ekva::cli::add_plan(app, action);
  ekva::cli::add_eval(app, action);
  ekva::cli::add_demo(app, action);
  ekva::cli::add_bench(app, action);
  ekva::cli::add_serve(app, action);
  ekva::cli::add_loadgen(app, action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive as parse errors whose code is 0; every usage error exits 1.
    return app.exit(e) == 0 ? 0 : 1;
  }
  try {
    return action();
  } catch (const ekva::Error& e) {
    fmt::print(stderr, "ekva: error ({}): {}\n", ekva::error_kind_name(e.kind()), e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "ekva: error (out of memory)\n");
    return 1;
  } catch (const std::exception& e) {
    // Library code converts what it can name; anything else (a std::filesystem error, say) still
    // ends in a message and status 1, not an abort.
    fmt::print(stderr, "ekva: error: {}\n", e.what());
    return 1;
  }
}
