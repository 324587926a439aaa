// SPDX-License-Identifier: Apache-2.0
// Who am I in the job, and the byte-level collectives over the store that setup code uses.
#pragma once

#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tpcomm/options.hpp"
#include "tpcomm/store.hpp"

namespace tpcomm {

/// Where a process sits in a job, as a launcher described it.
struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  /// -1 when the launcher does not say; `Bootstrap` then derives it from host names.
  int local_rank = -1;
  int local_world_size = -1;
  /// Rendezvous address of the store server (hosted by rank 0).
  std::string store_host = "127.0.0.1";
  int store_port = 0;
  /// Which launcher was recognised: "explicit", "torchrun", "ompi", "pmi", "slurm", "single".
  std::string source = "single";
};

/// Recognises the launcher from environment variables, in this order: explicit
/// (`TPCOMM_RANK`, `TPCOMM_WORLD_SIZE`, `TPCOMM_LOCAL_RANK`, `TPCOMM_LOCAL_WORLD_SIZE`,
/// `TPCOMM_STORE_ADDR=host:port`), torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
/// `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), Open MPI (`OMPI_COMM_WORLD_*`), PMI
/// (`PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`, `MPI_LOCALNRANKS`), Slurm (`SLURM_PROCID`,
/// `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE`). A launcher is recognised by its
/// rank or world-size variable; its local variables are optional (-1 when absent). Every
/// launcher takes the store address from `TPCOMM_STORE_ADDR` (`host:port`, `[ipv6]:port`)
/// when set, else from `MASTER_ADDR`/`MASTER_PORT`, where `MASTER_PORT + 1` is used when
/// `TORCHELASTIC_USE_AGENT_STORE` says that torchrun's agent serves its own store on
/// `MASTER_PORT`; a multi-process job without either is an error (MPI and Slurm do not provide
/// one). No variables at all means a single process (world
/// size 1). An empty value counts as unset.
///
/// `getenv(name)` returns nullptr when unset. Throws `Error(kInvalidArgument)` naming the
/// variable when a value is malformed or inconsistent (not an integer, rank >= world size,
/// local rank >= local world size, a port outside 1..65535, no store address for a
/// multi-process job).
LaunchInfo detect_launch(const std::function<const char*(const char*)>& getenv);

/// The rank's identity and the side channel to its peers.
///
/// Collectives (`barrier`, `broadcast`, `all_gather`) must be called by every rank of the
/// bootstrap in the same order; each is bounded by the store's default timeout (`timeout()`)
/// and throws `Error(kTimeout)` naming the ranks that did not arrive. Collective number `n`
/// keeps rank r's part under the key `<prefix>/<n>/<op>/<r>`; a rank erases its own keys once
/// every rank is past them (at its next barrier or all-gather), so the store stays small. Not
/// thread-safe: one thread per rank uses its `Bootstrap`. Move-only; a moved-from bootstrap
/// may only be destroyed or assigned to.
class Bootstrap {
 public:
  /// A bootstrap over an existing store. With `local_rank` and `local_world_size` given, no
  /// communication happens and node ids assume block placement (node = rank /
  /// local_world_size, as torchrun and `srun --distribution=block` place ranks). With either
  /// of them -1, all three are derived by all-gathering host names (ranks with the same host
  /// name share a node), so the constructor is then a collective.
  Bootstrap(std::shared_ptr<Store> store, int rank, int world_size, int local_rank = -1,
            int local_world_size = -1, std::string prefix = "tpcomm");
  ~Bootstrap();
  Bootstrap(Bootstrap&&) noexcept;
  Bootstrap& operator=(Bootstrap&&) noexcept;
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  /// From the launch environment (`detect_launch`): rank 0 hosts a `TcpStore` server bound to
  /// `Options::store_bind` (default loopback, or the store address when that is not a
  /// loopback address) with `Options::store_token`; the others connect, retrying until
  /// `Options::timeout_ms`. Node ids come from host names (one all-gather); local rank and
  /// size come from the launcher when it gives them, else from host names too. A world of one
  /// uses an `InProcessStore` and opens no socket. Collective.
  ///
  /// Under torchrun in a process that also runs torch.distributed, torch's store already
  /// holds MASTER_PORT: set `TPCOMM_STORE_ADDR` to another port.
  static Bootstrap from_env(const Options& options = Options::from_env());
  /// From an explicit description (same rules as `from_env`). Collective.
  static Bootstrap from_launch_info(const LaunchInfo& info, const Options& options);
  /// `world_size` bootstraps sharing one `InProcessStore`, for ranks that are threads of this
  /// process (virtual ranks on one GPU, or one thread per GPU). Element i is rank i.
  static std::vector<Bootstrap> in_process(int world_size,
                                           Milliseconds timeout = Milliseconds{30000});

  [[nodiscard]] int rank() const noexcept;
  [[nodiscard]] int world_size() const noexcept;
  [[nodiscard]] int local_rank() const noexcept;
  [[nodiscard]] int local_world_size() const noexcept;
  /// Index of this rank's host among the job's hosts, in order of first appearance by rank.
  [[nodiscard]] int node_id() const noexcept;
  /// Key prefix of this bootstrap's namespace in the store.
  [[nodiscard]] const std::string& prefix() const noexcept;
  [[nodiscard]] Store& store() noexcept;
  [[nodiscard]] std::shared_ptr<Store> shared_store() const noexcept;
  [[nodiscard]] Milliseconds timeout() const noexcept;
  /// The rank in the job (the bootstrap this one was split from, transitively) of this
  /// bootstrap's rank `r`; -1 for an `r` out of range.
  [[nodiscard]] int job_rank(int r) const noexcept;

  /// Returns when every rank has called it. Collective.
  void barrier();
  /// The same, waiting at most `timeout` instead of the bootstrap's own timeout (a group's calls
  /// wait no longer than the group's deadline).
  void barrier(Milliseconds timeout);
  /// Rank `root`'s `data` on every rank (`data` is ignored elsewhere). Collective.
  Bytes broadcast(std::span<const std::byte> data, int root);
  /// Every rank's `data`, indexed by rank. Lengths may differ per rank. Collective.
  std::vector<Bytes> all_gather(std::span<const std::byte> data);

  /// A bootstrap for the sub-group `ranks` (ranks of this bootstrap, strictly ascending,
  /// containing this rank), in its own key namespace `<prefix>/<tag>/<r0,r1,...>`. Its rank is
  /// this rank's index in `ranks`; its local ranks and node ids are renumbered within the
  /// sub-group. Local: no communication. Every member must use the same `tag` (non-empty, no
  /// '/') for the same sub-group; reusing a (tag, ranks) pair for two live sub-groups is an
  /// error of the caller. Throws `Error(kInvalidArgument)` for an invalid rank list or tag.
  [[nodiscard]] Bootstrap split(std::span<const int> ranks, std::string_view tag) const;

  /// Typed helpers for trivially copyable values.
  template <class T>
  std::vector<T> all_gather_value(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    auto parts = all_gather(std::as_bytes(std::span(&value, 1)));
    std::vector<T> out(parts.size());
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].size() != sizeof(T)) throw_size_mismatch(i, parts[i].size(), sizeof(T));
      std::memcpy(&out[i], parts[i].data(), sizeof(T));
    }
    return out;
  }
  template <class T>
  T broadcast_value(const T& value, int root) {
    static_assert(std::is_trivially_copyable_v<T>);
    auto b = broadcast(std::as_bytes(std::span(&value, 1)), root);
    if (b.size() != sizeof(T))
      throw_size_mismatch(static_cast<std::size_t>(root), b.size(), sizeof(T));
    T out;
    std::memcpy(&out, b.data(), sizeof(T));
    return out;
  }

 private:
  [[noreturn]] static void throw_size_mismatch(std::size_t rank, std::size_t got, std::size_t want);
  struct Impl;
  explicit Bootstrap(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpcomm
