// SPDX-License-Identifier: Apache-2.0
// `tpcomm store [--bind ADDR] [--port P] [--world-size N] [--insecure]`: a standalone store
// server until SIGINT/SIGTERM.
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "bootstrap/socket.hpp"
#include "core/check.hpp"
#include "tools/commands.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/store.hpp"

namespace tpcomm::tools {
namespace {

struct StoreArgs {
  std::string bind;
  int port = 0;
  int world_size = 0;
  bool insecure = false;
};

int run_store(const StoreArgs& args) {
  const Options options = Options::from_env();
  TcpStoreServerConfig config;
  config.bind = !args.bind.empty()            ? args.bind
                : !options.store_bind.empty() ? options.store_bind
                                              : "127.0.0.1";
  config.port = args.port;
  config.token = options.store_token;
  config.world_size = args.world_size;
  if (args.bind.empty() && !options.store_bind.empty()) {
    // Resolved here first so that an address that does not resolve names its variable.
    try {
      (void)net::resolve(options.store_bind, 0, /*passive=*/true);
    } catch (const Error& e) {
      TPCOMM_THROW(e.status(), "TPCOMM_STORE_BIND=\"", options.store_bind,
                   "\" is not valid: ", e.what());
    }
  }

  // A store that other machines can reach without a token lets any of them read and write the
  // job's keys: it is served only when asked for by name.
  if (config.token.empty() && !net::is_loopback(config.bind)) {
    TPCOMM_CHECK(args.insecure && !options.store_require_token, Status::kInvalidArgument,
                 "tpcomm store: ", config.bind,
                 " can be reached from other machines, and neither TPCOMM_STORE_TOKEN nor "
                 "TPCOMM_STORE_TOKEN_FILE is set",
                 options.store_require_token
                     ? " (TPCOMM_STORE_REQUIRE_TOKEN=1 forbids serving so, even with --insecure)"
                     : ": set a token, bind to loopback, or pass --insecure to serve anyone who "
                       "can connect");
  }

  // Block the signals before the server's threads start, so they inherit the mask and only
  // sigwait below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  TcpStoreServer server(config);
  std::fprintf(stderr, "tpcomm store: serving on %s %s\n",
               net::join_host_port(config.bind, server.port()).c_str(),
               config.token.empty()               ? "without a token"
               : options.store_token_file.empty() ? "with the token of TPCOMM_STORE_TOKEN"
                                                  : "with the token of TPCOMM_STORE_TOKEN_FILE");
  if (config.token.empty() && !net::is_loopback(config.bind)) {
    std::fprintf(stderr,
                 "tpcomm store: warning: reachable from the network and neither "
                 "TPCOMM_STORE_TOKEN nor TPCOMM_STORE_TOKEN_FILE is set; anyone who can connect "
                 "can read and write the store\n");
  }
  if (config.world_size == 0) {
    std::fprintf(stderr,
                 "tpcomm store: no --world-size: the store takes no rank watches (a client "
                 "that asks for one is refused)\n");
  }
  std::printf("%d\n", server.port());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  server.stop();
  std::fprintf(stderr, "tpcomm store: stopped by %s; %lld frames were rejected\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM",
               static_cast<long long>(server.rejected_frames()));
  return 0;
}

}  // namespace

void add_store_command(CLI::App& app, Command& run) {
  auto args = std::make_shared<StoreArgs>();
  CLI::App* sub = app.add_subcommand(
      "store",
      "Run a standalone store server until SIGINT or SIGTERM; prints its port on stdout. "
      "Clients must present TPCOMM_STORE_TOKEN when it is set.");
  sub->add_option("--bind", args->bind,
                  "address to bind (default: TPCOMM_STORE_BIND, else 127.0.0.1)");
  sub->add_option("--port", args->port, "port to listen on (0: any free port)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--world-size", args->world_size,
                  "the job's number of ranks: ranks 0..N-1 may watch each other through the "
                  "store (default 0: no rank watches)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_flag("--insecure", args->insecure,
                "serve without a token on an address other machines can reach");
  sub->callback([&run, args] { run = [args] { return run_store(*args); }; });
}

}  // namespace tpcomm::tools
