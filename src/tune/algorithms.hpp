// SPDX-License-Identifier: Apache-2.0
// The registry of custom all-reduce algorithms: the one place an algorithm is named. The
// selector, the tuner, the tuned table, the launcher's kernel lookup, the warm-up, the options,
// `tpcomm bench` and `tpcomm info` read it; none of them lists algorithms by hand. Adding an
// algorithm is a kernel file (kernels/), a row here and its tests.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>

#include "ipc/layout.hpp"
#include "kernels/kernels.hpp"

namespace tpcomm {

/// Every all-reduce kernel of the library, as `X(name)`: the function `kernels::name` that finds
/// its instantiations (`AllReduceKernel::instance`), defined in its own file (kernels/name.cu,
/// listed in CMakeLists.txt). Its weak declaration and its entry of `kAllReduceInstances` are
/// expanded from this list; each is the kernel of one row of `kAlgorithms` below, through which
/// the selector, the tuner and the warm-up (`launch_every_kernel`) find it.
/// tests/cpu/registry_test.cpp checks both directions: every row's kernel is in libtpcomm, and
/// every kernel of this list is a row's.
#define TPCOMM_ALL_REDUCE_KERNELS(X) \
  X(all_reduce_one_shot)             \
  X(all_reduce_two_shot)             \
  X(all_reduce_lamport)              \
  X(all_reduce_lamport_two_shot)

namespace kernels {
// Weak references: the registry is host code that builds without the kernels (the cpu tier links
// it alone, where these are null and nothing launches); in libtpcomm they are the kernels' own.
#define TPCOMM_DECLARE_KERNEL(name) [[gnu::weak]] const void* name(DType, int, Fusion) noexcept;
TPCOMM_ALL_REDUCE_KERNELS(TPCOMM_DECLARE_KERNEL)
#undef TPCOMM_DECLARE_KERNEL
}  // namespace kernels

/// Every kernel of `TPCOMM_ALL_REDUCE_KERNELS`, by its `AllReduceKernel::instance`.
#define TPCOMM_KERNEL_INSTANCE(name) &kernels::name,
inline constexpr std::array kAllReduceInstances{TPCOMM_ALL_REDUCE_KERNELS(TPCOMM_KERNEL_INSTANCE)};
#undef TPCOMM_KERNEL_INSTANCE

/// A custom all-reduce algorithm: a row of `kAlgorithms`, or `kNone`, meaning the custom kernels
/// do not serve the request (NCCL does).
enum class Algo : std::uint8_t { kNone, kOneShot, kTwoShot, kLamport, kLamportTwoShot };

/// Where the built-in choice (no tuned table, no `TPCOMM_ALGO`) takes an algorithm: among the
/// algorithms with a non-zero `order` that can serve a message, the lowest `order` whose bound
/// for the group's world size is at least the message's bytes.
struct BuiltIn {
  /// 0: the built-in choice never takes this algorithm (the tuner or `TPCOMM_ALGO` may).
  int order = 0;
  /// Largest message, in bytes, for 2 ranks, for up to 4 ranks, and for 5 to 8 ranks.
  std::int64_t two_ranks = 0;
  std::int64_t up_to_4_ranks = 0;
  std::int64_t more_ranks = 0;

  [[nodiscard]] constexpr std::int64_t bound(int world_size) const noexcept {
    return world_size == 2 ? two_ranks : world_size <= 4 ? up_to_4_ranks : more_ranks;
  }
};

/// Launch shapes the tuner measures for every algorithm: threads per block, and blocks per rank
/// (up to the algorithm's `max_blocks` and the group's limit).
inline constexpr std::array<int, 4> kTunerThreads{128, 256, 512, 1024};
inline constexpr std::array<int, 10> kTunerBlocks{1, 2, 4, 8, 12, 16, 24, 32, 48, 64};

/// One algorithm: what it is called, which kernel runs it, and where it fits.
struct AlgoInfo {
  Algo algo;
  /// As written in `TPCOMM_ALGO`, `tpcomm bench --algo` and tuned-table files.
  std::string_view name;
  /// One line for `tpcomm info` and `--help`.
  std::string_view summary;
  /// Other spellings `TPCOMM_ALGO` accepts (SGLang's names), or empty.
  std::array<std::string_view, 2> aliases;
  /// The kernel that runs it; the kernel says whether it pushes into the Lamport buffers (and so
  /// serves 16-bit types only, up to their size) and whether each rank works on one slice.
  kernels::AllReduceKernel kernel;
  /// Most blocks one rank's kernel may launch: the signal pad holds one flag row, operation
  /// count and start marker per block (`kMaxBlocks` of them).
  int max_blocks;
  BuiltIn built_in;
  /// The same for the fused all-reduce + residual add + RMSNorm, by the bytes of its input
  /// (order 0: the built-in choice never takes it). Only kernels that `fuses` serve it. Beyond
  /// every bound the fallback (the all-reduce, then the local add + RMSNorm) serves: measured
  /// faster there (docs/PERFORMANCE.md), where one block normalises rows one after another.
  BuiltIn fused;
};

inline constexpr std::int64_t kUnbounded = std::numeric_limits<std::int64_t>::max();

/// The algorithms, in the order the tuner measures them (ties go to the earlier one) and
/// `tpcomm bench --algo all` runs them. The built-in bounds follow vLLM's and SGLang's custom
/// all-reduce (one-shot below 512 KiB up to 4 ranks, 256 KiB above; always for 2 ranks) and
/// TensorRT-LLM's push one-shot (ahead of the pull kernels to about 256 KiB up to 4 ranks and
/// 64 KiB above on H100/H200).
inline constexpr std::array<AlgoInfo, 4> kAlgorithms{{
    {Algo::kOneShot,
     "one_shot",
     "barrier, then every rank reads every peer's input and writes the whole sum",
     {"oneshot", "1stage"},
     {&kernels::all_reduce_one_shot, /*pushes=*/false, /*sliced=*/false},
     kMaxBlocks,
     BuiltIn{2, kUnbounded, (std::int64_t{512} << 10) - 1, (std::int64_t{256} << 10) - 1},
     BuiltIn{}},
    {Algo::kTwoShot,
     "two_shot",
     "reduce-scatter, barrier, all-gather: about 2n bytes moved per rank",
     {"twoshot", "2stage"},
     {&kernels::all_reduce_two_shot, /*pushes=*/false, /*sliced=*/true},
     kMaxBlocks,
     BuiltIn{3, kUnbounded, kUnbounded, kUnbounded},
     BuiltIn{}},
    {Algo::kLamport,
     "lamport",
     "every rank pushes its input into every peer's receive buffer; the data is the flag "
     "(f16/bf16)",
     {},
     {&kernels::all_reduce_lamport, /*pushes=*/true, /*sliced=*/false},
     kMaxBlocks,
     BuiltIn{1, std::int64_t{256} << 10, std::int64_t{256} << 10, std::int64_t{64} << 10},
     BuiltIn{1, std::int64_t{2} << 20, std::int64_t{256} << 10, std::int64_t{128} << 10}},
    {Algo::kLamportTwoShot,
     "lamport_two_shot",
     "slices pushed to their owners, sums pushed back to every rank, no barrier (f16/bf16)",
     {},
     {&kernels::all_reduce_lamport_two_shot, /*pushes=*/true, /*sliced=*/true},
     kMaxBlocks,
     BuiltIn{},
     BuiltIn{2, std::int64_t{2} << 20, std::int64_t{2} << 20, std::int64_t{1} << 20}},
}};

// One row per kernel (which row's is checked where the kernels are linked: the addresses of weak
// functions are not constants).
static_assert(kAlgorithms.size() == kAllReduceInstances.size(),
              "every kernel of TPCOMM_ALL_REDUCE_KERNELS is the kernel of one row of kAlgorithms");

/// The row of `a`; `a` must not be `kNone`.
constexpr const AlgoInfo& info(Algo a) noexcept {
  return kAlgorithms[static_cast<std::size_t>(a) - 1];
}
static_assert(
    [] {
      for (std::size_t i = 0; i < kAlgorithms.size(); ++i)
        if (static_cast<std::size_t>(kAlgorithms[i].algo) != i + 1) return false;
      return true;
    }(),
    "kAlgorithms is indexed by Algo");

/// The algorithm's name, or "none" for `kNone` (the tuned tables' word for "NCCL won").
constexpr std::string_view to_string(Algo a) noexcept {
  return a == Algo::kNone ? std::string_view("none") : info(a).name;
}

/// The inverse of `to_string(Algo)`; exact names only, nullopt for anything else.
constexpr std::optional<Algo> parse_algo(std::string_view s) noexcept {
  if (s == "none") return Algo::kNone;
  for (const AlgoInfo& i : kAlgorithms)
    if (i.name == s) return i.algo;
  return std::nullopt;
}

/// True when `a` can carry `bytes` bytes of `dtype` among `world_size` ranks whose Lamport slots
/// hold `lamport_slot_bytes` bytes (0: the group has none). Algorithms that read peers' inputs
/// fit every message the staging buffer holds (checked elsewhere); those that push need a
/// 16-bit type and room in the slots.
constexpr bool fits(Algo a, std::int64_t bytes, DType dtype, int world_size,
                    std::int64_t lamport_slot_bytes) noexcept {
  const kernels::AllReduceKernel& k = info(a).kernel;
  if (!kernels::pushes(k)) return true;
  return dtype_size(dtype) == 2 &&
         kernels::lamport_slot_need(k, bytes, world_size) <= lamport_slot_bytes;
}

/// What `TPCOMM_ALGO` pins: an algorithm, `Algo::kNone` ("nccl": the custom kernels serve
/// nothing), or nullopt ("auto": the tuned table or the built-in choice decides).
using Pinned = std::optional<Algo>;

/// `TPCOMM_ALGO`'s value: "auto", "nccl", an algorithm's name or one of its aliases, in any
/// case and with '-' for '_'. False for anything else.
inline bool parse_pinned(std::string_view s, Pinned* out) {
  std::string v(s);
  for (char& c : v)
    c = c == '-' ? '_' : static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (v == "auto") {
    *out = std::nullopt;
    return true;
  }
  if (v == "nccl") {
    *out = Algo::kNone;
    return true;
  }
  for (const AlgoInfo& i : kAlgorithms) {
    if (i.name == v || (!v.empty() && (i.aliases[0] == v || i.aliases[1] == v))) {
      *out = i.algo;
      return true;
    }
  }
  return false;
}

/// "auto", "nccl" or the algorithm's name.
constexpr std::string_view to_string(Pinned p) noexcept {
  if (!p) return "auto";
  return *p == Algo::kNone ? std::string_view("nccl") : info(*p).name;
}

/// Every algorithm's name, separated by ", " (for error messages and `--help`).
inline std::string algo_names() {
  std::string out;
  for (const AlgoInfo& i : kAlgorithms) out += (out.empty() ? "" : ", ") + std::string(i.name);
  return out;
}

/// Every value `TPCOMM_ALGO` takes, separated by ", ".
inline std::string pinned_names() { return "auto, nccl, " + algo_names(); }

/// True for the block sizes the kernels are built for: 64, 128, 256, 512 or 1024 threads.
constexpr bool is_valid_threads(int threads) noexcept {
  return threads == 64 || threads == 128 || threads == 256 || threads == 512 || threads == 1024;
}

/// An algorithm and its launch shape: `blocks` per rank's kernel, `threads` per block, and for
/// the fused operation the blocks that share each row (`group`: `kernels::LaunchShape`).
///
/// For `Algo::kNone` blocks and threads are 0. Otherwise `blocks` is in
/// 1..`info(algo).max_blocks`, `threads` satisfies `is_valid_threads` and is at most the
/// algorithm's kernel's `kernels::max_threads`, and `group` is a power of
/// two up to `kernels::kMaxRowGroup` that divides `blocks`.
struct Choice {
  Algo algo = Algo::kNone;
  int blocks = 0;
  int threads = 0;
  int group = 1;

  [[nodiscard]] constexpr kernels::LaunchShape shape() const noexcept {
    return {blocks, threads, group};
  }

  friend bool operator==(const Choice&, const Choice&) = default;
};

/// True when `c` is a launch shape the kernels accept (see `Choice`).
constexpr bool is_valid(const Choice& c) noexcept {
  if (c.algo == Algo::kNone) return c.blocks == 0 && c.threads == 0;
  if (static_cast<std::size_t>(c.algo) > kAlgorithms.size()) return false;
  return c.blocks >= 1 && c.blocks <= info(c.algo).max_blocks && is_valid_threads(c.threads) &&
         c.threads <= kernels::max_threads(info(c.algo).kernel) &&
         kernels::is_valid_group(c.group, c.blocks);
}

/// "one_shot 8x512" (blocks x threads), or "none".
inline std::string to_string(const Choice& c) {
  std::string s(to_string(c.algo));
  if (c.algo != Algo::kNone) s += ' ' + std::to_string(c.blocks) + 'x' + std::to_string(c.threads);
  return s;
}

// ---- the exchange: all-gather, all-to-all and the LM-head exchange ------------------------

/// A custom exchange algorithm: a row of `kExchangeAlgorithms`, or `kNone` (NCCL serves).
enum class ExchangeAlgo : std::uint8_t { kNone, kPull, kPush };

/// One exchange algorithm: what it is called and where the built-in choice takes it.
struct ExchangeInfo {
  ExchangeAlgo algo;
  /// As written in `TPCOMM_EXCHANGE_ALGO`, `tpcomm bench --algo` and tuned-table files.
  std::string_view name;
  std::string_view summary;
  /// Most blocks one rank's kernel may launch (one flag row per block in the signal pad).
  int max_blocks;
  /// It pushes into the Lamport receive buffers (NOTE [exchange push] in
  /// kernels/exchange_push.cu): it serves calls whose regions are whole 4-byte words and fit the
  /// slots (`ExchangePlan::push_slot_bytes`). Otherwise it reads the staged inputs.
  bool lamport;
  /// By the most bytes one rank sends another (`ExchangePlan::largest_region`). The pull form is
  /// a copy at the memory's speed after one barrier, so unbounded within the staging buffer
  /// (NCCL serves what it cannot hold). The push form saves the barrier and the staging copy but
  /// sends two bytes for every byte: measured on one H200 (virtual ranks, graph-replayed, every
  /// exchange, docs/PERFORMANCE.md), it leads by 1.0-1.5 us up to 512 KiB a peer at 2 ranks and
  /// 64 KiB at 4, and trails from 1 MiB and 256 KiB; at 8 ranks (one H100, since each thread's
  /// lines travel in one batch) it leads by 0.4-1.8 us up to 32 KiB a peer and trails from 64 KiB.
  BuiltIn built_in;
};

/// The exchange algorithms, in the order `tpcomm bench --algo all` runs them. They serve
/// `Group::all_gather`, `Group::all_to_all` (equal split and per-peer counts) and
/// `Group::lm_head_exchange`, any dtype.
inline constexpr std::array<ExchangeInfo, 2> kExchangeAlgorithms{{
    {ExchangeAlgo::kPull, "pull",
     "barrier, then every rank copies what it receives from each peer's buffer straight to its "
     "place in the output (the LM head's reassembly included)",
     kMaxBlocks, false, BuiltIn{2, kUnbounded, kUnbounded, kUnbounded}},
    {ExchangeAlgo::kPush, "push",
     "every rank writes each peer's part into that peer's receive buffer in lines that carry "
     "their own flags; no barrier, no staging copy (regions of whole 4-byte words)",
     kMaxBlocks, true,
     BuiltIn{1, std::int64_t{512} << 10, std::int64_t{64} << 10, std::int64_t{32} << 10}},
}};

/// The row of `a`; `a` must not be `kNone`.
constexpr const ExchangeInfo& info(ExchangeAlgo a) noexcept {
  return kExchangeAlgorithms[static_cast<std::size_t>(a) - 1];
}
static_assert(
    [] {
      for (std::size_t i = 0; i < kExchangeAlgorithms.size(); ++i)
        if (static_cast<std::size_t>(kExchangeAlgorithms[i].algo) != i + 1) return false;
      return true;
    }(),
    "kExchangeAlgorithms is indexed by ExchangeAlgo");

/// The algorithm's name, or "none" for `kNone`.
constexpr std::string_view to_string(ExchangeAlgo a) noexcept {
  return a == ExchangeAlgo::kNone ? std::string_view("none") : info(a).name;
}

/// What `TPCOMM_EXCHANGE_ALGO` pins: nothing ("auto"), or an exchange algorithm, taken where it
/// serves the call (the built-in choice serves the rest).
using PinnedExchange = std::optional<ExchangeAlgo>;

/// The inverse of `to_string(PinnedExchange)`: "auto" or an algorithm's name.
constexpr bool parse_pinned_exchange(std::string_view s, PinnedExchange* out) noexcept {
  if (s == "auto") {
    *out = std::nullopt;
    return true;
  }
  for (const ExchangeInfo& i : kExchangeAlgorithms)
    if (i.name == s) {
      *out = i.algo;
      return true;
    }
  return false;
}

constexpr std::string_view to_string(PinnedExchange p) noexcept {
  return p ? to_string(*p) : std::string_view("auto");
}

/// True when exchange algorithm `a` can serve a call whose push form needs `push_slot_bytes` of
/// a Lamport slot (0: it cannot push) in a group whose slots hold `lamport_slot_bytes`.
constexpr bool fits(ExchangeAlgo a, std::int64_t push_slot_bytes,
                    std::int64_t lamport_slot_bytes) noexcept {
  return !info(a).lamport || (push_slot_bytes > 0 && push_slot_bytes <= lamport_slot_bytes);
}

/// Every exchange algorithm's name, separated by ", ".
inline std::string exchange_names() {
  std::string out;
  for (const ExchangeInfo& e : kExchangeAlgorithms)
    out += (out.empty() ? "" : ", ") + std::string(e.name);
  return out;
}

/// An exchange algorithm and its launch shape; both 0 for `ExchangeAlgo::kNone`.
struct ExchangeChoice {
  ExchangeAlgo algo = ExchangeAlgo::kNone;
  int blocks = 0;
  int threads = 0;

  [[nodiscard]] constexpr kernels::LaunchShape shape() const noexcept { return {blocks, threads}; }
  friend bool operator==(const ExchangeChoice&, const ExchangeChoice&) = default;
};

/// "pull 8x512" (blocks x threads), or "none".
inline std::string to_string(const ExchangeChoice& c) {
  std::string s(to_string(c.algo));
  if (c.algo != ExchangeAlgo::kNone)
    s += ' ' + std::to_string(c.blocks) + 'x' + std::to_string(c.threads);
  return s;
}

inline std::ostream& operator<<(std::ostream& os, Algo a) { return os << to_string(a); }
inline std::ostream& operator<<(std::ostream& os, const Choice& c) { return os << to_string(c); }

}  // namespace tpcomm
