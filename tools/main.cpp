// SPDX-License-Identifier: Apache-2.0
// The `tpcomm` program: info, bench, tune, step, launch, policy, store.
#include <cstdio>
#include <exception>

#include "tools/commands.hpp"
#include "tpcomm/status.hpp"

namespace {

int run_program(int argc, char** argv) {
  // Results appear line by line even when stdout is a file or a pipe.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"tpcomm: collectives for tensor-parallel LLM inference"};
  app.require_subcommand(1);
  app.set_version_flag("--version", TPCOMM_VERSION);
  tpcomm::tools::Command run;
  tpcomm::tools::add_info_command(app, run);
  tpcomm::tools::add_launch_command(app, run);
  tpcomm::tools::add_policy_command(app, run);
  tpcomm::tools::add_store_command(app, run);
#ifdef TPCOMM_WITH_KERNELS
  tpcomm::tools::add_bench_command(app, run);
  tpcomm::tools::add_tune_command(app, run);
  tpcomm::tools::add_step_command(app, run);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return run ? run() : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_program(argc, argv);
  } catch (const tpcomm::Error& e) {
    std::fprintf(stderr, "tpcomm: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpcomm: unexpected error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "tpcomm: unexpected error\n");
  }
  return 1;
}
