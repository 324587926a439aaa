// SPDX-License-Identifier: Apache-2.0
// Bootstrap: the rank's identity and byte collectives over a Store.
#include "tpcomm/bootstrap.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>

#include "bootstrap/deadline.hpp"
#include "bootstrap/socket.hpp"
#include "core/check.hpp"
#include "core/log.hpp"
#include "tpcomm/status.hpp"

namespace tpcomm {
namespace {

using detail::concat;

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) out += concat(i == 0 ? "" : ", ", ranks[i]);
  return out;
}

std::string hostname() {
  char buf[HOST_NAME_MAX + 1] = {};
  TPCOMM_CHECK(::gethostname(buf, sizeof(buf) - 1) == 0, Status::kSystemError,
               "gethostname: ", std::strerror(errno));
  return buf;
}

// Warns, once per process, that the store at `address` is open to the network.
void warn_open_store(const std::string& address) {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  TPCOMM_LOG_WARN(
      "bootstrap: rank 0 hosts the store on ", address,
      ", which other machines can reach, without a token: anyone who can connect to it can "
      "read and write the keys through which the ranks exchange peer-memory handles and ids, "
      "and so spy on, disrupt or take over the job's communication. Give every rank the same "
      "secret with TPCOMM_STORE_TOKEN=secret or TPCOMM_STORE_TOKEN_FILE=path, or keep a "
      "one-node job on loopback with TPCOMM_STORE_BIND=127.0.0.1");
}

}  // namespace

// NOTE [bootstrap keys]
// Collective number `seq` (counted per Bootstrap, from 1) of operation `op` keeps rank r's part
// under "<prefix>/<seq>/<op>/<r>". Every rank calls the collectives in the same order, so the
// same `seq` names the same call everywhere. A rank sets its key for `seq` only after it has
// finished `seq - 1`; so once a rank has seen every rank's key of a barrier or all-gather
// `seq`, no rank will read any key of an earlier collective again, and the rank erases its own
// keys of those. Broadcasts wait only for the root, so their keys go at the next barrier or
// all-gather.
//
// NOTE [bootstrap at scale]
// Every rank waiting for every rank's key costs world^2 requests of the store: a million for the
// launcher's 1024 ranks, which a store on a few cores cannot serve within a timeout. So a
// barrier counts arrivals (one ADD a rank; the last to arrive sets "<seq>/barrier/done", which
// the others wait for) and an all-gather goes through rank 0 (which waits for every part, reads
// them and sets them packed in one value, "<seq>/all_gather/all", that the others read): a few
// requests a rank. Each rank still sets its own key first, so that a wait that times out can
// name the ranks that never arrived. Seeing the done key or the packed value means every rank
// has set its key of `seq`, as seeing every key did.
struct Bootstrap::Impl {
  struct OwnKey {
    std::uint64_t seq;
    std::string key;
  };

  std::shared_ptr<Store> store;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_id = 0;
  // The node index of every rank, in order of first appearance by rank.
  std::vector<int> node_of_rank;
  // The job rank (rank in the bootstrap that was split) of every rank.
  std::vector<int> job_ranks;
  std::string prefix;
  std::uint64_t seq = 0;
  std::vector<OwnKey> own_keys;

  Impl(std::shared_ptr<Store> s, int r, int w, std::string p)
      : store(std::move(s)), rank(r), world_size(w), prefix(std::move(p)) {
    TPCOMM_CHECK(store != nullptr, Status::kInvalidArgument, "Bootstrap: the store is null");
    TPCOMM_CHECK(world_size >= 1, Status::kInvalidArgument, "Bootstrap: world size ", world_size,
                 " is not positive");
    TPCOMM_CHECK(rank >= 0 && rank < world_size, Status::kInvalidArgument, "Bootstrap: rank ", rank,
                 " is out of range for world size ", world_size);
    TPCOMM_CHECK(!prefix.empty(), Status::kInvalidArgument, "Bootstrap: empty key prefix");
    job_ranks.resize(static_cast<std::size_t>(world_size));
    std::iota(job_ranks.begin(), job_ranks.end(), 0);
  }

  [[nodiscard]] Milliseconds timeout() const { return store->default_timeout(); }

  [[nodiscard]] std::string key(std::uint64_t s, std::string_view op, int r) const {
    return concat(prefix, "/", s, "/", op, "/", r);
  }

  void set_own(std::uint64_t s, std::string key, std::span<const std::byte> data) {
    store->set(key, data);
    own_keys.push_back({s, std::move(key)});
  }

  // NOTE [bootstrap keys]: called once every rank's key of collective `s` has been seen.
  void erase_before(std::uint64_t s) {
    auto done = std::stable_partition(own_keys.begin(), own_keys.end(),
                                      [&](const OwnKey& k) { return k.seq >= s; });
    for (auto it = done; it != own_keys.end(); ++it) store->erase(it->key);
    own_keys.erase(done, own_keys.end());
  }

  [[noreturn]] void throw_timeout(std::uint64_t s, std::string_view op,
                                  const std::vector<int>& missing,
                                  std::optional<Milliseconds> waited = std::nullopt) const {
    TPCOMM_THROW(Status::kTimeout, op, " #", s, " of bootstrap '", prefix, "' timed out after ",
                 waited.value_or(timeout()).count(), " ms on rank ", rank, ": ",
                 missing.size() == 1 ? "rank " : "ranks ", join_ranks(missing), " did not arrive");
  }

  // Waits until every rank has set its key of collective `s`; on timeout names the ranks
  // whose keys are missing.
  void wait_all(std::uint64_t s, std::string_view op, Deadline deadline,
                std::optional<Milliseconds> waited = std::nullopt) {
    std::vector<std::string> keys(static_cast<std::size_t>(world_size));
    for (int r = 0; r < world_size; ++r) keys[static_cast<std::size_t>(r)] = key(s, op, r);
    try {
      store->wait(keys, remaining(deadline));
    } catch (const Error& e) {
      if (e.status() != Status::kTimeout) throw;
      std::vector<int> missing;
      for (int r = 0; r < world_size; ++r) {
        if (!store->check(std::span(&keys[static_cast<std::size_t>(r)], 1))) missing.push_back(r);
      }
      if (!missing.empty()) throw_timeout(s, op, missing, waited);
    }
  }

  // Waits for `key`, set once every rank has set its key of collective `s` (NOTE [bootstrap at
  // scale]), and returns its value; on timeout names the ranks whose keys are missing, or
  // `last` when none is (the rank that sets `key`; -1: whichever arrived last).
  Bytes await_all(std::uint64_t s, std::string_view op, const std::string& key_all, int last,
                  Deadline deadline, std::optional<Milliseconds> waited = std::nullopt) {
    try {
      return store->get(key_all, remaining(deadline));
    } catch (const Error& e) {
      if (e.status() != Status::kTimeout) throw;
      std::vector<int> missing;
      for (int r = 0; r < world_size; ++r) {
        const std::string k = key(s, op, r);
        if (!store->check(std::span(&k, 1))) missing.push_back(r);
      }
      if (missing.empty() && last < 0) {
        TPCOMM_THROW(Status::kTimeout, op, " #", s, " of bootstrap '", prefix, "' timed out after ",
                     waited.value_or(timeout()).count(), " ms on rank ", rank,
                     ": every rank arrived, but the last of them did not finish it");
      }
      throw_timeout(s, op, missing.empty() ? std::vector<int>{last} : missing, waited);
    }
  }

  void barrier(Milliseconds timeout) {
    const std::uint64_t s = ++seq;
    if (world_size == 1) return;
    const Deadline deadline = deadline_after(timeout);
    set_own(s, key(s, "barrier", rank), {});
    const std::string count = concat(prefix, "/", s, "/barrier/count");
    const std::string done = concat(prefix, "/", s, "/barrier/done");
    if (store->add(count, 1, remaining(deadline)) == world_size) {
      set_own(s, done, {});
      own_keys.push_back({s, count});  // the last to arrive erases it with its own keys
    } else {
      (void)await_all(s, "barrier", done, -1, deadline, timeout);
    }
    erase_before(s);
  }

  /// Most bytes rank 0 packs into one value (NOTE [bootstrap at scale]); larger all-gathers
  /// have every rank read every part.
  static constexpr std::size_t kMaxPacked = std::size_t{16} << 20;

  std::vector<Bytes> all_gather(std::span<const std::byte> data) {
    const std::uint64_t s = ++seq;
    std::vector<Bytes> out(static_cast<std::size_t>(world_size));
    out[static_cast<std::size_t>(rank)].assign(data.begin(), data.end());
    if (world_size == 1) return out;
    const Deadline deadline = deadline_after(timeout());
    set_own(s, key(s, "all_gather", rank), data);
    const std::string all = concat(prefix, "/", s, "/all_gather/all");
    auto read_every_part = [&] {
      for (int r = 0; r < world_size; ++r) {
        if (r != rank)
          out[static_cast<std::size_t>(r)] =
              store->get(key(s, "all_gather", r), remaining(deadline));
      }
    };
    if (rank == 0) {
      wait_all(s, "all_gather", deadline);
      read_every_part();
      set_own(s, all, pack(out));
    } else {
      const Bytes packed = await_all(s, "all_gather", all, 0, deadline);
      if (!unpack(packed, out)) read_every_part();
    }
    erase_before(s);
    return out;
  }

  // Every part, each as an 8-byte little-endian length and its bytes, after a 1; or a lone 0
  // where they come to more than `kMaxPacked` (the parts are then read one by one).
  static Bytes pack(const std::vector<Bytes>& parts) {
    std::size_t total = 1;
    for (const Bytes& p : parts) total += 8 + p.size();
    if (total > kMaxPacked) return Bytes{std::byte{0}};
    Bytes out;
    out.reserve(total);
    out.push_back(std::byte{1});
    for (const Bytes& p : parts) {
      for (int b = 0; b < 8; ++b)
        out.push_back(static_cast<std::byte>(static_cast<std::uint64_t>(p.size()) >> (8 * b)));
      out.insert(out.end(), p.begin(), p.end());
    }
    return out;
  }

  // The parts of `pack`'s value into `out` (this rank's own part is already there); false for
  // the lone 0. A malformed value is a protocol error.
  bool unpack(const Bytes& packed, std::vector<Bytes>& out) const {
    TPCOMM_CHECK(!packed.empty() && (packed[0] == std::byte{0} || packed[0] == std::byte{1}),
                 Status::kProtocolError, "bootstrap '", prefix, "': a malformed all-gather value");
    if (packed[0] == std::byte{0}) return false;
    std::size_t at = 1;
    for (int r = 0; r < world_size; ++r) {
      TPCOMM_CHECK(packed.size() - at >= 8, Status::kProtocolError, "bootstrap '", prefix,
                   "': a malformed all-gather value");
      std::uint64_t n = 0;
      for (int b = 0; b < 8; ++b) n |= std::to_integer<std::uint64_t>(packed[at + b]) << (8 * b);
      at += 8;
      TPCOMM_CHECK(packed.size() - at >= n, Status::kProtocolError, "bootstrap '", prefix,
                   "': a malformed all-gather value");
      if (r != rank)
        out[static_cast<std::size_t>(r)].assign(
            packed.begin() + static_cast<std::ptrdiff_t>(at),
            packed.begin() + static_cast<std::ptrdiff_t>(at + n));
      at += n;
    }
    return true;
  }

  Bytes broadcast(std::span<const std::byte> data, int root) {
    TPCOMM_CHECK(root >= 0 && root < world_size, Status::kInvalidArgument, "broadcast: root ", root,
                 " is out of range for world size ", world_size);
    const std::uint64_t s = ++seq;
    if (rank == root) {
      if (world_size > 1) set_own(s, key(s, "broadcast", root), data);
      return Bytes(data.begin(), data.end());
    }
    try {
      return store->get(key(s, "broadcast", root), timeout());
    } catch (const Error& e) {
      if (e.status() != Status::kTimeout) throw;
      throw_timeout(s, "broadcast", {root});
    }
  }

  // Locality from the launcher, trusted as given, assuming the usual block placement (ranks
  // of a node are consecutive and every node runs `local_world_size` of them) for node ids.
  void set_block_locality(int lr, int lw) {
    TPCOMM_CHECK(lw >= 1 && lw <= world_size, Status::kInvalidArgument,
                 "Bootstrap: local world size ", lw, " is out of range 1..", world_size);
    TPCOMM_CHECK(lr >= 0 && lr < lw, Status::kInvalidArgument, "Bootstrap: local rank ", lr,
                 " is out of range for local world size ", lw);
    local_rank = lr;
    local_world_size = lw;
    node_of_rank.resize(static_cast<std::size_t>(world_size));
    for (int r = 0; r < world_size; ++r) node_of_rank[static_cast<std::size_t>(r)] = r / lw;
    node_id = node_of_rank[static_cast<std::size_t>(rank)];
  }

  // Sets locality from the ranks' node ids.
  void set_locality_from_nodes(std::vector<int> nodes) {
    node_of_rank = std::move(nodes);
    node_id = node_of_rank[static_cast<std::size_t>(rank)];
    local_rank = 0;
    local_world_size = 0;
    for (int r = 0; r < world_size; ++r) {
      if (node_of_rank[static_cast<std::size_t>(r)] != node_id) continue;
      if (r < rank) ++local_rank;
      ++local_world_size;
    }
  }

  // Collective: all-gathers host names. Ranks with the same host name share a node.
  void derive_locality(int given_local_rank, int given_local_world) {
    const std::string host = hostname();
    auto hosts = all_gather(std::as_bytes(std::span(host.data(), host.size())));
    std::map<std::string, int> index;
    std::vector<int> nodes(hosts.size());
    for (std::size_t r = 0; r < hosts.size(); ++r) {
      std::string name(reinterpret_cast<const char*>(hosts[r].data()), hosts[r].size());
      nodes[r] = index.try_emplace(std::move(name), static_cast<int>(index.size())).first->second;
    }
    set_locality_from_nodes(std::move(nodes));
    if (given_local_rank >= 0 && given_local_world >= 1) {
      // The launcher knows best which device this process owns (host names can repeat across
      // nodes in containers); keep its numbers and only warn when the names disagree.
      if (given_local_rank != local_rank || given_local_world != local_world_size) {
        TPCOMM_LOG_WARN("bootstrap: the launcher says local rank ", given_local_rank, " of ",
                        given_local_world, ", host names say ", local_rank, " of ",
                        local_world_size, "; using the launcher's");
      }
      local_rank = given_local_rank;
      local_world_size = given_local_world;
    }
  }
};

Bootstrap::Bootstrap(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}

Bootstrap::Bootstrap(std::shared_ptr<Store> store, int rank, int world_size, int local_rank,
                     int local_world_size, std::string prefix)
    : impl_(std::make_unique<Impl>(std::move(store), rank, world_size, std::move(prefix))) {
  if (local_rank >= 0 && local_world_size >= 1) {
    impl_->set_block_locality(local_rank, local_world_size);
  } else {
    impl_->derive_locality(-1, -1);
  }
}

Bootstrap::~Bootstrap() = default;
Bootstrap::Bootstrap(Bootstrap&&) noexcept = default;
Bootstrap& Bootstrap::operator=(Bootstrap&&) noexcept = default;

Bootstrap Bootstrap::from_env(const Options& options) {
  return from_launch_info(detect_launch([](const char* name) { return std::getenv(name); }),
                          options);
}

Bootstrap Bootstrap::from_launch_info(const LaunchInfo& info, const Options& options) {
  const Milliseconds timeout{options.timeout_ms};
  TPCOMM_CHECK(info.world_size >= 1 && info.rank >= 0 && info.rank < info.world_size,
               Status::kInvalidArgument, "rank ", info.rank, " of world size ", info.world_size,
               " is out of range");
  if (info.world_size == 1) {
    // Nobody to talk to: no sockets.
    auto store = std::make_shared<InProcessStore>();
    store->set_default_timeout(timeout);
    return Bootstrap(std::move(store), 0, 1, 0, 1);
  }
  TcpStore::Config config;
  config.host = info.store_host;
  config.port = info.store_port;
  config.token = options.store_token;
  config.timeout = timeout;
  if (options.rank_watch) config.watch_rank = info.rank;
  if (info.rank == 0) {
    config.host_server = true;
    config.server.token = options.store_token;
    config.server.world_size = info.world_size;
    config.server.watch_ranks = options.rank_watch;
    if (!options.store_bind.empty()) {
      // Resolved here first so that an address that does not resolve names its variable.
      try {
        (void)net::resolve(options.store_bind, 0, /*passive=*/true);
      } catch (const Error& e) {
        TPCOMM_THROW(e.status(), "TPCOMM_STORE_BIND=\"", options.store_bind,
                     "\" is not valid: ", e.what());
      }
      config.server.bind = options.store_bind;
    } else if (net::is_loopback(info.store_host)) {
      config.server.bind = info.store_host.find(':') != std::string::npos ? "::1" : "127.0.0.1";
    } else {
      config.server.bind = info.store_host;
    }
  }
  TPCOMM_LOG_INFO("bootstrap: rank ", info.rank, " of ", info.world_size, " (", info.source,
                  "), store at ", net::join_host_port(info.store_host, info.store_port),
                  info.rank == 0 ? concat(", hosted here on ", config.server.bind) : "");
  const std::string bind = config.server.bind;
  const bool open_store = info.rank == 0 && options.store_token.empty() && !net::is_loopback(bind);
  TPCOMM_CHECK(!open_store || !options.store_require_token, Status::kInvalidArgument,
               "bootstrap: rank 0 would host the store on ", bind,
               ", which other machines can reach, without a token, and "
               "TPCOMM_STORE_REQUIRE_TOKEN=1 forbids that: give every rank the same secret with "
               "TPCOMM_STORE_TOKEN or TPCOMM_STORE_TOKEN_FILE, or bind the store to loopback "
               "(TPCOMM_STORE_BIND=127.0.0.1) for a job on one node");
  std::shared_ptr<TcpStore> store;
  try {
    store = std::make_shared<TcpStore>(std::move(config));
  } catch (const Error& e) {
    if (info.rank != 0 || e.status() != Status::kSystemError) throw;
    TPCOMM_THROW(e.status(), "rank 0 cannot host the store: ", e.what(),
                 " (choose a free port with TPCOMM_STORE_ADDR=host:port)");
  }
  if (open_store) {
    warn_open_store(net::join_host_port(bind, store->port()));
  }
  auto impl = std::make_unique<Impl>(std::move(store), info.rank, info.world_size, "tpcomm");
  impl->derive_locality(info.local_rank, info.local_world_size);
  return Bootstrap(std::move(impl));
}

std::vector<Bootstrap> Bootstrap::in_process(int world_size, Milliseconds timeout) {
  TPCOMM_CHECK(world_size >= 1, Status::kInvalidArgument, "in_process: world size ", world_size,
               " is not positive");
  auto store = std::make_shared<InProcessStore>();
  store->set_default_timeout(timeout);
  std::vector<Bootstrap> out;
  out.reserve(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) out.emplace_back(store, r, world_size, r, world_size);
  return out;
}

int Bootstrap::rank() const noexcept { return impl_->rank; }
int Bootstrap::world_size() const noexcept { return impl_->world_size; }
int Bootstrap::local_rank() const noexcept { return impl_->local_rank; }
int Bootstrap::local_world_size() const noexcept { return impl_->local_world_size; }
int Bootstrap::node_id() const noexcept { return impl_->node_id; }
const std::string& Bootstrap::prefix() const noexcept { return impl_->prefix; }
Store& Bootstrap::store() noexcept { return *impl_->store; }
std::shared_ptr<Store> Bootstrap::shared_store() const noexcept { return impl_->store; }
Milliseconds Bootstrap::timeout() const noexcept { return impl_->timeout(); }

int Bootstrap::job_rank(int r) const noexcept {
  return r >= 0 && r < impl_->world_size ? impl_->job_ranks[static_cast<std::size_t>(r)] : -1;
}

void Bootstrap::barrier() { impl_->barrier(impl_->timeout()); }

void Bootstrap::barrier(Milliseconds timeout) { impl_->barrier(timeout); }

Bytes Bootstrap::broadcast(std::span<const std::byte> data, int root) {
  return impl_->broadcast(data, root);
}

std::vector<Bytes> Bootstrap::all_gather(std::span<const std::byte> data) {
  return impl_->all_gather(data);
}

Bootstrap Bootstrap::split(std::span<const int> ranks, std::string_view tag) const {
  const Impl& m = *impl_;
  TPCOMM_CHECK(!tag.empty() && tag.find('/') == std::string_view::npos, Status::kInvalidArgument,
               "split: the tag \"", tag, "\" must be non-empty and contain no '/'");
  TPCOMM_CHECK(!ranks.empty(), Status::kInvalidArgument, "split: empty rank list");
  int self = -1;
  std::string list;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    TPCOMM_CHECK(r >= 0 && r < m.world_size, Status::kInvalidArgument, "split: rank ", r,
                 " is out of range for world size ", m.world_size);
    TPCOMM_CHECK(i == 0 || ranks[i - 1] < r, Status::kInvalidArgument,
                 "split: ranks must be strictly ascending, got ", ranks[i - 1], " before ", r);
    if (r == m.rank) self = static_cast<int>(i);
    list += concat(i == 0 ? "" : ",", r);
  }
  TPCOMM_CHECK(self >= 0, Status::kInvalidArgument, "split: rank ", m.rank,
               " is not in the sub-group [", list, "]");
  auto sub = std::make_unique<Impl>(m.store, self, static_cast<int>(ranks.size()),
                                    concat(m.prefix, "/", tag, "/", list));
  // Renumber the nodes in order of first appearance within the sub-group.
  std::map<int, int> renumber;
  std::vector<int> nodes(ranks.size());
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const int node = m.node_of_rank[static_cast<std::size_t>(ranks[i])];
    nodes[i] = renumber.try_emplace(node, static_cast<int>(renumber.size())).first->second;
  }
  sub->set_locality_from_nodes(std::move(nodes));
  for (std::size_t i = 0; i < ranks.size(); ++i)
    sub->job_ranks[i] = m.job_ranks[static_cast<std::size_t>(ranks[i])];
  return Bootstrap(std::move(sub));
}

void Bootstrap::throw_size_mismatch(std::size_t rank, std::size_t got, std::size_t want) {
  TPCOMM_THROW(Status::kInvalidArgument, "rank ", rank, " sent ", got, " bytes where ", want,
               " were expected: the ranks disagree on the value's type");
}

}  // namespace tpcomm
