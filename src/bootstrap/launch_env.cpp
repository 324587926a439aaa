// SPDX-License-Identifier: Apache-2.0
// detect_launch: which launcher started this process, and where the store is.
#include <array>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "core/check.hpp"
#include "core/parse.hpp"
#include "tpcomm/bootstrap.hpp"

namespace tpcomm {
namespace {

// The variables one launcher sets. A launcher is recognised when its rank or world-size
// variable is set; the local ones are optional.
struct Launcher {
  const char* source;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

// Checked in this order: an explicit description wins over whatever launcher is around it.
constexpr std::array<Launcher, 5> kLaunchers{{
    {"explicit", "TPCOMM_RANK", "TPCOMM_WORLD_SIZE", "TPCOMM_LOCAL_RANK",
     "TPCOMM_LOCAL_WORLD_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"ompi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
}};

class Env {
 public:
  explicit Env(const std::function<const char*(const char*)>& getenv) : getenv_(getenv) {}

  // An empty value counts as unset, as `VAR= program` usually means "not set".
  [[nodiscard]] std::optional<std::string> get(const char* name) const {
    const char* v = getenv_(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  }

  [[nodiscard]] std::optional<int> integer(const char* name, int min) const {
    auto v = get(name);
    if (!v) return std::nullopt;
    auto n = parse_int(*v);
    if (!n || *n < min || *n > std::numeric_limits<int>::max()) {
      TPCOMM_THROW(Status::kInvalidArgument, name, "=\"", *v, "\" is not valid: expected ",
                   min == 0 ? "a non-negative integer" : "a positive integer");
    }
    return static_cast<int>(*n);
  }

  [[nodiscard]] int require_integer(const char* name, int min, const char* because) const {
    auto v = integer(name, min);
    if (!v) TPCOMM_THROW(Status::kInvalidArgument, name, " is not set, but ", because, " is");
    return *v;
  }

 private:
  const std::function<const char*(const char*)>& getenv_;
};

int parse_port(const char* name, const std::string& text) {
  auto p = parse_int(text);
  if (!p || *p < 1 || *p > 65535) {
    TPCOMM_THROW(Status::kInvalidArgument, name, "=\"", text,
                 "\" is not valid: expected a port number 1..65535");
  }
  return static_cast<int>(*p);
}

// "host:port" or "[ipv6]:port".
std::pair<std::string, int> parse_store_addr(const std::string& text) {
  constexpr const char* kName = "TPCOMM_STORE_ADDR";
  auto bad = [&](const char* why) -> std::pair<std::string, int> {
    TPCOMM_THROW(Status::kInvalidArgument, kName, "=\"", text, "\" is not valid: ", why);
  };
  std::string host;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return bad("expected [ipv6-address]:port");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos) return bad("expected host:port");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string::npos)
      return bad("write an IPv6 address in brackets, as [::1]:29500");
  }
  if (host.empty()) return bad("the host is empty");
  auto p = parse_int(port);
  if (!p || *p < 1 || *p > 65535) return bad("the port must be a number 1..65535");
  return {host, static_cast<int>(*p)};
}

// The first launcher in kLaunchers whose rank or world-size variable is set; null for none.
const Launcher* find_launcher(const Env& env) {
  for (const Launcher& l : kLaunchers) {
    if (env.get(l.rank) || env.get(l.world_size)) return &l;
  }
  return nullptr;
}

// Fills the rank, world size and the local ones from launcher `l`'s variables.
void read_ranks(const Env& env, const Launcher& l, LaunchInfo& info) {
  info.source = l.source;
  info.rank = env.require_integer(l.rank, 0, l.world_size);
  info.world_size = env.require_integer(l.world_size, 1, l.rank);
  if (info.rank >= info.world_size) {
    TPCOMM_THROW(Status::kInvalidArgument, l.rank, "=", info.rank,
                 " is out of range: ", l.world_size, " is ", info.world_size);
  }
  auto local_world = env.integer(l.local_world_size, 1);
  if (local_world && *local_world > info.world_size) {
    TPCOMM_THROW(Status::kInvalidArgument, l.local_world_size, "=", *local_world,
                 " is larger than ", l.world_size, "=", info.world_size);
  }
  auto local_rank = env.integer(l.local_rank, 0);
  if (local_rank && *local_rank >= (local_world ? *local_world : info.world_size)) {
    TPCOMM_THROW(Status::kInvalidArgument, l.local_rank, "=", *local_rank,
                 " is out of range: ", local_world ? l.local_world_size : l.world_size, " is ",
                 local_world ? *local_world : info.world_size);
  }
  info.local_rank = local_rank.value_or(-1);
  info.local_world_size = local_world.value_or(-1);
}

// The store address from MASTER_ADDR and MASTER_PORT (both or neither; neither leaves `info`
// as it is).
void read_master_addr(const Env& env, LaunchInfo& info) {
  auto host = env.get("MASTER_ADDR");
  auto port = env.get("MASTER_PORT");
  if (host && !port) {
    TPCOMM_THROW(Status::kInvalidArgument, "MASTER_ADDR is set but MASTER_PORT is not");
  }
  if (port && !host) {
    TPCOMM_THROW(Status::kInvalidArgument, "MASTER_PORT is set but MASTER_ADDR is not");
  }
  if (!host) return;
  info.store_host = *host;
  if (info.store_host.size() >= 2 && info.store_host.front() == '[' &&
      info.store_host.back() == ']')
    info.store_host = info.store_host.substr(1, info.store_host.size() - 2);
  info.store_port = parse_port("MASTER_PORT", *port);
  // torchrun's agent already serves its own store on MASTER_PORT and tells its workers so:
  // tpcomm's store takes the next port.
  if (auto agent = env.get("TORCHELASTIC_USE_AGENT_STORE");
      agent && (*agent == "True" || *agent == "true" || *agent == "1")) {
    if (info.store_port == 65535) {
      TPCOMM_THROW(Status::kInvalidArgument,
                   "MASTER_PORT=65535 is torchrun's own store, and there is no next port "
                   "for tpcomm's: set TPCOMM_STORE_ADDR=host:port");
    }
    ++info.store_port;
  }
}

}  // namespace

LaunchInfo detect_launch(const std::function<const char*(const char*)>& getenv) {
  const Env env(getenv);
  LaunchInfo info;
  if (const Launcher* l = find_launcher(env)) read_ranks(env, *l, info);

  // The rendezvous address, for every launcher: TPCOMM_STORE_ADDR, else MASTER_ADDR/PORT.
  if (auto addr = env.get("TPCOMM_STORE_ADDR")) {
    std::tie(info.store_host, info.store_port) = parse_store_addr(*addr);
  } else {
    read_master_addr(env, info);
  }
  if (info.world_size > 1 && info.store_port == 0) {
    TPCOMM_THROW(Status::kInvalidArgument, "a ", info.source, " job of ", info.world_size,
                 " ranks needs the address of its store: set MASTER_ADDR and MASTER_PORT (or "
                 "TPCOMM_STORE_ADDR=host:port)");
  }
  return info;
}

}  // namespace tpcomm
