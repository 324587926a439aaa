// SPDX-License-Identifier: Apache-2.0
// The tuned table: per size bucket, the all-reduce algorithm that was fastest, and its cache file.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tpcomm/options.hpp"
#include "tune/algorithms.hpp"

namespace tpcomm {

/// What a tuned table was measured on. A table is only reused where every field matches: a
/// different GPU model, group size, link topology, driver, NCCL or tpcomm build can change
/// which algorithm wins.
struct TuneKey {
  /// GPU model as the driver names it, e.g. "NVIDIA H200".
  std::string gpu;
  /// Ranks in the group the table was measured for.
  int world_size = 0;
  /// A short description of the links between the group's GPUs, e.g. "nvlink-full".
  std::string topology;
  /// `cuDriverGetVersion`, e.g. 12040; 0 when unknown.
  int driver_version = 0;
  /// NCCL's version code, e.g. 22703; 0 when NCCL was not loaded.
  int nccl_version = 0;
  /// tpcomm's version, e.g. "0.1.0".
  std::string tpcomm_version;

  friend bool operator==(const TuneKey&, const TuneKey&) = default;

  /// One line of `name=value` pairs, in declaration order, e.g.
  /// `gpu="NVIDIA H200" world_size=8 topology=nvlink-full driver_version=12040 ...`. String
  /// values that are empty or hold anything but letters, digits and `._+-:/` are written in
  /// double quotes with C-style escapes (`\"`, `\\`, `\n`, `\t`, `\r`, `\xHH`), so any value
  /// round-trips through `TuneTable::parse`.
  [[nodiscard]] std::string to_text() const;

  /// The fields that differ, each with this key's value first and `other`'s second, joined by
  /// ", ": e.g. `world_size 8 != 4, gpu "NVIDIA H100" != "NVIDIA H200"`. Empty when equal.
  [[nodiscard]] std::string difference(const TuneKey& other) const;
};

/// One size bucket: requests of more than the previous bucket's `max_bytes` and at most this
/// one's use `choice`, which took `time_us` microseconds per call when tuned.
struct TuneEntry {
  /// Upper bound of the bucket, in bytes, inclusive.
  std::int64_t max_bytes = 0;
  Choice choice;
  /// Measured time of `choice` for a message of `max_bytes` bytes (rank 0's measurement).
  double time_us = 0.0;

  friend bool operator==(const TuneEntry&, const TuneEntry&) = default;
};

/// One size bucket of the exchanges (all-gather, all-to-all, the LM head's), by the most bytes
/// any rank receives: the exchange algorithm and launch shape that was fastest.
struct ExchangeEntry {
  std::int64_t max_bytes = 0;
  ExchangeChoice choice;
  double time_us = 0.0;

  friend bool operator==(const ExchangeEntry&, const ExchangeEntry&) = default;
};

/// The tuned all-reduce table of one group: a key and size buckets sorted by upper bound.
///
/// The tuner fills one entry per bound of `bucket_bounds(max)`; a lookup is a binary search.
/// An entry whose algorithm is `Algo::kNone` records that NCCL won that bucket. Rank 0 builds
/// the table and broadcasts it, so every rank of a group holds the same table (rank invariance,
/// docs/DESIGN.md §3). A table is immutable once built and may be read from any thread.
///
/// Text format, version 2 (every line ends with '\n'; blank lines and lines whose first
/// non-blank character is '#' are comments, except the mandatory first line; a file that
/// starts with a UTF-8 byte order mark is refused, naming it):
///
///     # tpcomm tune table v2
///     key gpu="NVIDIA H200" world_size=8 topology=nvlink-full driver_version=12040 ...
///     # max_bytes algo blocks threads time_us
///     512 one_shot 1 512 4.5
///     1024 one_shot 1 512 4.6
///     ...
///     8388608 two_shot 36 512 61.25
///     end 15
///
/// The last line, `end N`, counts the bucket lines before it (of every kind): a table without
/// it, or with another count, was cut short and is refused (version 1 had no end line; its
/// files are refused as another version).
/// The `key` line comes before any bucket line and holds all six `TuneKey` fields (see
/// `TuneKey::to_text`). A bucket line is five whitespace-separated fields: `max_bytes` (a
/// positive integer, strictly increasing from line to line), `algo` (`none` or an algorithm's
/// name in the registry, tune/algorithms.hpp), `blocks` (1..the algorithm's `max_blocks`) and
/// `threads` (64, 128, 256, 512 or 1024; at most 512 for the Lamport algorithms,
/// `kernels::max_threads`) — both 0 for `none` — and `time_us` (a finite number
/// >= 0). Bucket lines of the fused all-reduce + residual add + RMSNorm (sized by the bytes of
/// its input) are the same five fields after the word `fused`, with their own increasing
/// bounds and an algorithm that fuses (or `none`: the fallback won); a table without them is
/// still valid. Bucket lines of the exchanges (by the most bytes any rank receives) are the
/// same five fields after the word `exchange`, with an exchange algorithm's name
/// (`kExchangeAlgorithms`) or `none` (NCCL serves); also optional.
class TuneTable {
 public:
  /// An empty table: it covers no size.
  TuneTable() = default;
  /// Throws `Error(kInvalidArgument)` when the entries break the rules of the text format
  /// (unsorted or duplicate bounds, a launch shape out of range, a negative time).
  TuneTable(TuneKey key, std::vector<TuneEntry> entries, std::vector<TuneEntry> fused = {},
            std::vector<ExchangeEntry> exchange = {});

  [[nodiscard]] const TuneKey& key() const noexcept { return key_; }
  /// Sorted by strictly increasing `max_bytes`.
  [[nodiscard]] const std::vector<TuneEntry>& entries() const noexcept { return entries_; }
  /// The fused operation's buckets, sorted like `entries`; may be empty.
  [[nodiscard]] const std::vector<TuneEntry>& fused_entries() const noexcept { return fused_; }
  /// The exchanges' buckets, sorted like `entries`; may be empty.
  [[nodiscard]] const std::vector<ExchangeEntry>& exchange_entries() const noexcept {
    return exchange_;
  }
  /// The largest size the table covers, in bytes; 0 when empty.
  [[nodiscard]] std::int64_t max_bytes() const noexcept;

  /// The choice of the first bucket whose bound is >= `bytes` (so sizes up to the first bound,
  /// 0 and below included, use the first bucket); nullopt beyond the last bucket or when the
  /// table is empty. O(log buckets), no allocation.
  [[nodiscard]] std::optional<Choice> lookup(std::int64_t bytes) const noexcept;
  /// The same over the fused operation's buckets.
  [[nodiscard]] std::optional<Choice> lookup_fused(std::int64_t bytes) const noexcept;
  /// The same over the exchanges' buckets.
  [[nodiscard]] std::optional<ExchangeChoice> lookup_exchange(std::int64_t bytes) const noexcept;

  /// The bucket bounds a tuner measures up to `max_bytes`: 512, 1024, 2048, ... up to and
  /// including the largest power of two <= `max_bytes`, then `max_bytes` itself when it is not
  /// a power of two. A `max_bytes` below 512 gives the single bound `max_bytes`. Throws
  /// `Error(kInvalidArgument)` when `max_bytes` <= 0.
  [[nodiscard]] static std::vector<std::int64_t> bucket_bounds(std::int64_t max_bytes);

  /// The text form described above; `parse(to_text())` gives back an equal table (times are
  /// written in the shortest form that reads back to the same double).
  [[nodiscard]] std::string to_text() const;

  /// Reads the text form. Throws `Error(kProtocolError)` whose message names the line number
  /// and what is wrong for any malformed input; never reads out of bounds, whatever the bytes.
  [[nodiscard]] static TuneTable parse(std::string_view text);

  /// Reads a table file that must have been measured under `expected`. Returns nullopt, and
  /// stores the reason in `*why` when `why` is not null, when the file is missing, unreadable,
  /// malformed or its key differs (the reason then reads `key differs: ` followed by
  /// `file_key.difference(expected)`). Never throws for a bad file: a cache is only a hint.
  /// Reads only a regular file (or a symbolic link to one): anything else (a FIFO, a device, a
  /// directory) gives the reason `not a regular file (a FIFO)` and so on, without blocking.
  [[nodiscard]] static std::optional<TuneTable> load(const std::string& path,
                                                     const TuneKey& expected, std::string* why);

  /// Writes the text form to `path` atomically: a temporary file in the same directory,
  /// flushed to disk, then renamed over `path`; readers see the old file or the new one, never
  /// a part. Creates missing parent directories. Throws `Error(kSystemError)` naming the path
  /// and the system error text on failure (the temporary file is removed), and refuses a `path`
  /// that exists and is not a regular file (a device node, a FIFO, a directory), leaving it as
  /// it was. The temporary file is `.NAME.tmp-XXXXXX`; a save also removes those of the same
  /// target left more than a minute ago by a save that was killed before its rename.
  void save(const std::string& path) const;

  friend bool operator==(const TuneTable&, const TuneTable&) = default;

 private:
  TuneKey key_;
  std::vector<TuneEntry> entries_;
  std::vector<TuneEntry> fused_;
  std::vector<ExchangeEntry> exchange_;
};

/// Where the table of `key` is cached by default: the directory `$XDG_CACHE_HOME/tpcomm/`, else
/// `$HOME/.cache/tpcomm/`, else `/tmp/tpcomm-cache/` (a variable counts only when it is set to
/// an absolute path), and the file `tune-w<world_size>-<gpu slug>.txt`, where the slug is the
/// GPU name in lower case with every run of other characters than letters and digits turned
/// into one '-' (e.g. `tune-w8-nvidia-h200.txt`). `getenv(name)` returns nullopt when unset.
[[nodiscard]] std::string default_tune_path(
    const TuneKey& key, const std::function<std::optional<std::string>(const char*)>& getenv);
/// Same, reading the process environment.
[[nodiscard]] std::string default_tune_path(const TuneKey& key);

/// The tune file to use: `options.tune_file` (`TPCOMM_TUNE_FILE`) when set, else
/// `default_tune_path(key)`.
[[nodiscard]] std::string tune_path(const Options& options, const TuneKey& key);

namespace detail {

/// Parses a table's text (`TuneTable::to_text`'s format) into its parts: an error message
/// ("line N: ..."), empty when the text is a table.
std::string parse_table_text(std::string_view text, TuneKey* key, std::vector<TuneEntry>* entries,
                             std::vector<TuneEntry>* fused, std::vector<ExchangeEntry>* exchange);

}  // namespace detail

}  // namespace tpcomm
