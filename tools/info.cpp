// SPDX-License-Identifier: Apache-2.0
// `tpcomm info`: prints the library's report (src/api/info.hpp). Exits 0 on any machine, GPU or
// not, and 1 (after the full report) when a TPCOMM_* variable is invalid.
#include <iostream>
#include <memory>

#include "api/info.hpp"
#include "tools/commands.hpp"

namespace tpcomm::tools {
namespace {

int run_info(bool as_json) {
  int invalid_knobs = 0;
  std::cout << info_report(as_json, &invalid_knobs);
  std::cout.flush();
  // The report is printed in full either way; an environment that tpcomm would refuse is not a
  // healthy one.
  return invalid_knobs == 0 ? 0 : 1;
}

}  // namespace

void add_info_command(CLI::App& app, Command& run) {
  CLI::App* cmd = app.add_subcommand(
      "info", "Show the build, GPUs, peer access and NVLink, NCCL, usable backends and knobs");
  auto as_json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *as_json, "Print the same information as one JSON object");
  cmd->callback([&run, as_json] { run = [as_json] { return run_info(*as_json); }; });
}

}  // namespace tpcomm::tools
