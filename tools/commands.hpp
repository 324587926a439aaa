// SPDX-License-Identifier: Apache-2.0
// Subcommands of the `tpcomm` program. Each adds itself to the CLI11 app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace tpcomm::tools {

/// A chosen subcommand's body; returns the process exit code.
using Command = std::function<int()>;

/// Each registers one subcommand on `app` and stores its body in `run` when it is selected.
void add_info_command(CLI::App& app, Command& run);
void add_launch_command(CLI::App& app, Command& run);
void add_policy_command(CLI::App& app, Command& run);
void add_store_command(CLI::App& app, Command& run);
void add_bench_command(CLI::App& app, Command& run);
void add_tune_command(CLI::App& app, Command& run);
void add_step_command(CLI::App& app, Command& run);

}  // namespace tpcomm::tools
