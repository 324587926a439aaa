// SPDX-License-Identifier: Apache-2.0
// Every knob of tpcomm, read once from the environment into one struct.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "tpcomm/types.hpp"

namespace tpcomm {

/// Log verbosity, from `TPCOMM_LOG`.
enum class LogLevel : int { kOff, kError, kWarn, kInfo, kDebug, kTrace };

std::string_view to_string(LogLevel l) noexcept;
std::optional<LogLevel> parse_log_level(std::string_view s) noexcept;

/// What a group's watchdog does when the group fails (a lost rank, a kernel that gave up, ranks
/// that called different collectives), from `TPCOMM_ASYNC_ERROR_HANDLING`.
enum class FailureMode : int {
  /// Mark the group failed at once and log it; the next call returns the failure (`Group`'s
  /// contract: the caller builds a new group). Outputs of the kernels that could not complete,
  /// graph replays included, are poisoned (NaN).
  kRaise,
  /// Log the failure and take the process down (`std::abort`), as PyTorch's process groups do:
  /// no call after the fault can return. Not for ranks that are threads of one process.
  kTeardown,
  /// As kRaise, then call the handler given to `Group::set_failure_mode` on the watchdog's
  /// thread (engines that drain and restart).
  kCallback,
};
std::string_view to_string(FailureMode m) noexcept;
std::optional<FailureMode> parse_failure_mode(std::string_view s) noexcept;

/// Whether a group's all-reduces and fused all-reduce + norms are batch-invariant (a token's
/// result bitwise the same whatever batch it rides in: docs/DETERMINISM.md), from
/// `TPCOMM_DETERMINISTIC` or `GroupConfig::deterministic`.
enum class Determinism : int {
  /// The fastest path for each size: NCCL (or the unfused pair) where it is faster.
  kOff,
  /// The custom kernels serve every such call they can hold (the tuned table's and the built-in
  /// bounds that hand a size to NCCL or to the unfused pair for speed are lifted up to the
  /// workspaces), and the fused kernels take a launch shape fixed by the hidden size alone. A
  /// call they cannot serve runs as before, and the group logs once that it is not invariant.
  kOn,
  /// As kOn, but such a call is refused with kInvalidArgument, naming its size and the limit;
  /// nothing is launched and the outputs are not written.
  kStrict,
};
std::string_view to_string(Determinism d) noexcept;
/// 0, off, false, no; 1, on, true, yes; strict (any case).
std::optional<Determinism> parse_determinism(std::string_view s) noexcept;

/// All run-time knobs. `from_env()` reads each `TPCOMM_*` variable once; a field left at its
/// default means the variable was unset. `NCCL_*` variables are never read here: they pass
/// through to NCCL untouched.
///
/// | variable | field | default |
/// |---|---|---|
/// | `TPCOMM_LOG` | `log_level` | `warn` |
/// | `TPCOMM_NCCL_PATH` | `nccl_path` | `libnccl.so.2` |
/// | `TPCOMM_TIMEOUT_MS` | `timeout_ms` | 30000 (at most `kMaxTimeoutMs`, 365 days) |
/// | `TPCOMM_ALGO` | `algo` | `auto` |
/// | `TPCOMM_EXCHANGE_ALGO` | `exchange_algo` | `auto` |
/// | `TPCOMM_TUNE_FILE` | `tune_file` | `$XDG_CACHE_HOME/tpcomm/tune-w<world>-<gpu>.txt` |
/// | `TPCOMM_CUSTOM_AR_MAX_BYTES` | `custom_ar_max_bytes` | 8 MiB (at most 4 GiB) |
/// | `TPCOMM_CUSTOM_AR_REGISTER_BYTES` | `custom_ar_register_min_bytes` | 2 MiB (at most 4 GiB) |
/// | `TPCOMM_LAMPORT_MAX_BYTES` | `lamport_max_bytes` | 512 KiB |
/// | `TPCOMM_FUSION_MAX_TOKENS` | `fusion_max_tokens` | 128 (0: only `lamport_max_bytes` counts) |
/// | `TPCOMM_FUSION_HIDDEN` | `fusion_hidden` | 8192 |
/// | `TPCOMM_DISABLE_CUSTOM_AR` | `disable_custom_ar` | 0 |
/// | `TPCOMM_DISABLE_NCCL` | `disable_nccl` | 0 |
/// | `TPCOMM_PDL` | `programmatic_launch` | 1 |
/// | `TPCOMM_RANK_WATCH` | `rank_watch` | 1 |
/// | `TPCOMM_HEARTBEAT_TIMEOUT_MS` | `heartbeat_timeout_ms` | 5000 (200 to `kMaxTimeoutMs`) |
/// | `TPCOMM_ASYNC_ERROR_HANDLING` | `failure_mode` | `raise` (or `teardown`, `callback`) |
/// | `TPCOMM_LM_HEAD_A2A` | `lm_head_a2a` | `auto` |
/// | `TPCOMM_MOE_PROLOGUE` | `moe_prologue` | `auto` (off: the combine, then the fused norm) |
/// | `TPCOMM_NCCL_CHECK` | `nccl_check` | `auto` (eager NCCL calls of at least 64 MiB) |
/// | `TPCOMM_STORE_TOKEN` | `store_token` | empty (no authentication; set and empty are alike) |
/// | `TPCOMM_STORE_TOKEN_FILE` | `store_token_file`, `store_token` | unset |
/// | `TPCOMM_STORE_BIND` | `store_bind` | loopback, or `MASTER_ADDR` when it is not loopback |
/// | `TPCOMM_STORE_REQUIRE_TOKEN` | `store_require_token` | 0 |
/// | `TPCOMM_DETERMINISTIC` | `deterministic` | 0 (or 1, `strict`) |
struct Options;

/// Every environment variable `Options::from_env` reads, in the table's order above: the one
/// list of knobs, which `tpcomm info` shows (each with its value) and which a cpu test compares
/// with the names the code reads.
std::span<const std::string_view> knob_names() noexcept;

/// Bytes of one rank's slot in each Lamport buffer of a group of `world_size` ranks under `o`:
/// `lamport_max_bytes` (at most `custom_ar_max_bytes`), or more where the fused operation's
/// `fusion_max_tokens` x `fusion_hidden` rows need it; 0 when `lamport_max_bytes` is 0. Each rank
/// holds 3 x world size x this.
std::int64_t lamport_slot_bytes(const Options& o, int world_size) noexcept;

struct Options {
  LogLevel log_level = LogLevel::kWarn;
  /// Path or soname handed to dlopen for NCCL.
  std::string nccl_path = "libnccl.so.2";
  /// Longest `timeout_ms`, in milliseconds: 365 days. `from_env` refuses a larger
  /// `TPCOMM_TIMEOUT_MS` with an error naming the variable (it does not clamp it); a larger value
  /// set in code is used as this cap. Every deadline (`now + timeout`, in nanoseconds for the
  /// kernels and NCCL) stays far from overflowing at the cap.
  static constexpr std::int64_t kMaxTimeoutMs = std::int64_t{365} * 24 * 3600 * 1000;
  /// Deadline for every wait: store operations, kernel spin-waits, NCCL completion polling.
  /// Positive, at most `kMaxTimeoutMs`.
  std::int64_t timeout_ms = 30000;
  /// The all-reduce algorithm: "auto" (the tuned table, else the built-in choice; NCCL serves
  /// what the custom kernels do not), "nccl" (NCCL for everything), or the name of one custom
  /// algorithm (`tpcomm info` lists them), used wherever it can serve, the built-in choice
  /// elsewhere. A name that is none of these makes `from_env` (and building a group) throw.
  std::string algo = "auto";
  /// The exchanges' algorithm (all-gather, all-to-all, the LM-head exchange): "auto" (the tuned
  /// table, else the built-in choice), or "pull" or "push" (`tpcomm info` lists them), used
  /// wherever it can serve, the built-in choice elsewhere. `algo` "nccl" overrides it. A name that
  /// is none of these makes `from_env` (and building a group) throw.
  std::string exchange_algo = "auto";
  /// Where the tuned table is cached; empty means the default location, which falls back to
  /// `$HOME/.cache/tpcomm/` and then `/tmp/tpcomm-cache/` (see `default_tune_path`).
  std::string tune_file;
  /// Most bytes `from_env` accepts for `custom_ar_max_bytes` (each rank then holds three times
  /// this in peer memory) and `custom_ar_register_min_bytes`: 4 GiB.
  static constexpr std::int64_t kMaxCustomArBytes = std::int64_t{4} << 30;
  /// Largest all-reduce, in bytes, that the custom kernels serve; larger ones go to NCCL.
  std::int64_t custom_ar_max_bytes = std::int64_t{8} << 20;
  /// Inside a capture scope, custom all-reduces of at least this many bytes read the caller's
  /// buffers in place (registered when the scope closes, plus an end barrier); smaller ones copy
  /// into the workspace inside the kernel, which costs less than the extra barrier. The same for
  /// the custom exchanges (all-gather, all-to-all, the LM head's), by the largest rank's input;
  /// they stage smaller inputs with a copy kernel of their own.
  std::int64_t custom_ar_register_min_bytes = std::int64_t{2} << 20;
  /// Most bytes `from_env` accepts for `lamport_max_bytes`, and for the fused rows'
  /// `fusion_max_tokens` x `fusion_hidden` x 2: 1 GiB.
  static constexpr std::int64_t kMaxLamportBytes = std::int64_t{1} << 30;
  /// Largest all-reduce, in bytes, that the Lamport kernel serves (0: no Lamport buffers). Each
  /// rank holds 3 x world size x this many bytes of receive buffers.
  std::int64_t lamport_max_bytes = std::int64_t{512} << 10;
  /// Most tokens (rows) of `fusion_hidden` 16-bit elements that the fused all-reduce + residual
  /// add + RMSNorm serves from the same Lamport buffers, as SGLang sizes its fusion workspace:
  /// the buffers are made large enough for the two-shot form of that many rows (rows x hidden x 2
  /// bytes among the ranks: `lamport_slot_bytes`) when that is more than `lamport_max_bytes`
  /// gives. The defaults hold DeepSeek-V3 (7168) and Llama-3.1-70B (8192) decode batches of up
  /// to 128 tokens on 2 to 8 ranks, for 12 MiB of receive buffers per rank at any world size. At
  /// most 65536 tokens and a hidden size of 65536, and rows of at most `kMaxLamportBytes` (tokens
  /// x hidden x 2 bytes); 0 tokens: only `lamport_max_bytes` counts.
  /// Ignored when `lamport_max_bytes` is 0 (no Lamport buffers).
  std::int64_t fusion_max_tokens = 128;
  std::int64_t fusion_hidden = 8192;
  bool disable_custom_ar = false;
  bool disable_nccl = false;
  /// Launch the custom kernels as programmatic dependent launches, so that their launch
  /// latency hides behind the kernel before them on the stream (Hopper and later).
  bool programmatic_launch = true;
  /// Notice within milliseconds that a rank's process of a multi-process job is gone (its
  /// connection to the store closed without leaving normally): every survivor's groups then
  /// fail their pending and next calls with kAborted naming the rank, and waits on the store
  /// fail at once instead of at their deadlines. Off: only the deadlines notice.
  bool rank_watch = true;
  /// Over the application's own store (`tpcomm_bootstrap_from_store`), where no connection
  /// tells that a rank is gone, the rank watch is a heartbeat: a peer whose heartbeat stopped
  /// for this long is reported lost (NOTE [heartbeat watch] in src/bootstrap/heartbeat.hpp).
  /// At least `kMinHeartbeatTimeoutMs`, at most `kMaxTimeoutMs`.
  std::int64_t heartbeat_timeout_ms = 5000;
  /// Shortest `heartbeat_timeout_ms`: 20 beats of the shortest period (10 ms), so that a healthy
  /// rank's beats, late by a busy host or a slow store call, are not taken for silence. Below
  /// it, a timeout of one or two periods would report a healthy peer lost within milliseconds.
  static constexpr std::int64_t kMinHeartbeatTimeoutMs = 200;
  /// What each group's watchdog does when the group fails (`FailureMode`); `Group::
  /// set_failure_mode` overrides it per group.
  FailureMode failure_mode = FailureMode::kRaise;
  /// The user's setting for assembling a vocabulary-sharded LM head's logits with one
  /// all-to-all, to pass as `LmHeadA2aInputs::lm_head_a2a` (tpcomm/policy.hpp): auto lets
  /// `decide_lm_head_a2a` decide, 1 and 0 force it on and off. Accepted, in any case: auto;
  /// 1, on, true, yes; 0, off, false, no. Off also makes `Group::lm_head_exchange` take its
  /// fallback (an all-gather of the shards, then a copy of the local rows: SGLang's path before
  /// the all-to-all); auto and on let the custom exchange serve where it can.
  Switch lm_head_a2a = Switch::kAuto;
  /// How `Group::moe_finalize_all_reduce_add_rmsnorm` runs the combine: on makes it a prologue
  /// of the fused kernel (each rank combines its rows as it pushes them: one launch); off and
  /// auto launch the combine kernel first, then the fused all-reduce + norm. Auto is the
  /// built-in choice: inside whole decode steps the prologue measured slower than the two
  /// launches at one token and no faster at 128 (NOTE [the combine's launch] in
  /// src/ops/moe_combine.cpp), so auto takes the two. Accepted as `lm_head_a2a`.
  Switch moe_prologue = Switch::kAuto;
  /// Whether an eager collective that NCCL serves is checked first: the ranks compare its
  /// fingerprint and call number (NOTE [fingerprints]) through one barrier of the custom kernels
  /// (where the group has them), so that ranks that disagree fail with kMismatch naming both
  /// calls, and NCCL, which would hang or return garbage, is aborted. auto: calls of at least
  /// `kNcclCheckMinBytes`, where the barrier costs under 2% of NCCL's time (docs/PERFORMANCE.md);
  /// on: every one; off: none. The same on every rank (building a group compares it).
  Switch nccl_check = Switch::kAuto;
  /// The smallest eager NCCL-served call `nccl_check` auto checks, in bytes.
  static constexpr std::int64_t kNcclCheckMinBytes = std::int64_t{64} << 20;
  /// Shared secret every store client must present, at most 1024 bytes (`from_env` refuses a
  /// longer `TPCOMM_STORE_TOKEN`, naming the variable); empty disables the check, and an empty
  /// `TPCOMM_STORE_TOKEN=` counts as unset.
  std::string store_token;
  /// The file `store_token` was read from (`TPCOMM_STORE_TOKEN_FILE`), empty when none. The
  /// token is the file's contents less trailing newlines (CR or LF), 1 to 1024 bytes; the file
  /// must be a regular file (a FIFO or device is refused without blocking). A missing,
  /// unreadable, empty or too long file, or `TPCOMM_STORE_TOKEN` set as well, makes `from_env`
  /// throw naming the variable. Every rank of a job reads the same path, which suits launchers
  /// that give every rank the same environment (torchrun, mpirun, srun) without putting the
  /// secret itself in the environment.
  std::string store_token_file;
  /// Address the store server binds to; empty means the default rule above.
  std::string store_bind;
  /// Refuse to host a store that other machines can reach (bound off loopback) without a token:
  /// rank 0's bootstrap then throws `Error(kInvalidArgument)` naming this knob instead of
  /// warning. Off by default, so tokenless multi-node jobs (torchrun) start as they always did.
  bool store_require_token = false;
  /// Batch-invariant all-reduces and fused norms (`Determinism`); `GroupConfig::deterministic`
  /// overrides it per group. The same on every rank (building a group compares it).
  Determinism deterministic = Determinism::kOff;

  /// Reads the environment. Throws `Error(kInvalidArgument)` naming the variable when a value
  /// cannot be parsed (a typo in a knob is an error, not a silent default).
  static Options from_env();
  /// Same, with a custom lookup (for tests): `getenv(name)` returns nullopt when unset.
  static Options from_lookup(const std::function<std::optional<std::string>(const char*)>& getenv);
};

}  // namespace tpcomm
