// SPDX-License-Identifier: Apache-2.0
// TuneTable: lookup and the versioned text format (the cache file is in table_file.cpp).
#include "tune/table.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <system_error>
#include <utility>

#include "core/check.hpp"
#include "core/parse.hpp"

namespace tpcomm {
namespace {

constexpr std::string_view kHeader = "# tpcomm tune table v2";
constexpr std::string_view kHeaderPrefix = "# tpcomm tune table v";
constexpr std::string_view kColumns = "# max_bytes algo blocks threads time_us";
/// The first word of a bucket line of the fused all-reduce + add + RMSNorm.
constexpr std::string_view kFused = "fused";
/// The first word of a bucket line of the exchanges.
constexpr std::string_view kExchange = "exchange";
/// The first word of the last line: "end N", N the number of bucket lines before it.
constexpr std::string_view kEnd = "end";
constexpr int kVersion = 2;
/// A UTF-8 byte order mark, which some editors put at the start of a file.
constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";
/// How much of a bad token an error message repeats.
constexpr std::size_t kMaxShown = 40;

bool is_space(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split_fields(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && is_space(s[i])) ++i;
    std::size_t start = i;
    while (i < s.size() && !is_space(s[i])) ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

/// Characters a key value may hold without quotes.
bool is_bare(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '+' || c == '-' || c == ':' || c == '/';
}

/// `s` in double quotes with C-style escapes; bytes >= 0x80 (UTF-8) are kept as they are.
std::string quoted(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          out += "\\x";
          out += kHex[u >> 4];
          out += kHex[u & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

/// A key value as written in the text form: bare when that is unambiguous, else quoted.
std::string format_value(std::string_view s) {
  if (!s.empty() && std::all_of(s.begin(), s.end(), is_bare)) return std::string(s);
  return quoted(s);
}

/// A piece of untrusted input, quoted and shortened, for an error message.
std::string shown(std::string_view s) {
  if (s.size() <= kMaxShown) return quoted(s);
  return quoted(s.substr(0, kMaxShown)) + "...";
}

int hex_digit(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<double> parse_double(std::string_view s) noexcept {
  double v = 0.0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::string format_double(double v) {
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  if (ec != std::errc()) return "0";
  return std::string(buf, p);
}

/// The number of algorithms of the registry `a` belongs to (all-reduce or exchange).
constexpr std::size_t registry_size(Algo) noexcept { return kAlgorithms.size(); }
constexpr std::size_t registry_size(ExchangeAlgo) noexcept { return kExchangeAlgorithms.size(); }

/// The most threads a block of algorithm `a`'s kernel takes.
constexpr int max_threads(Algo a) noexcept { return kernels::max_threads(info(a).kernel); }
constexpr int max_threads(ExchangeAlgo /*a*/) noexcept { return 1024; }

/// Why `e` may not follow `prev` (null for the first entry) in a table; empty when it may. For
/// the all-reduce's buckets (`TuneEntry`) and the exchanges' (`ExchangeEntry`) alike.
template <class Entry>
std::string entry_error(const Entry& e, const Entry* prev) {
  using detail::concat;
  if (e.max_bytes <= 0) return concat("max_bytes ", e.max_bytes, " is not positive");
  if (prev != nullptr && e.max_bytes == prev->max_bytes)
    return concat("duplicate bucket ", e.max_bytes);
  if (prev != nullptr && e.max_bytes < prev->max_bytes)
    return concat("bucket ", e.max_bytes, " follows bucket ", prev->max_bytes,
                  ": buckets must be in increasing order");
  const auto& c = e.choice;
  if (static_cast<std::size_t>(c.algo) > registry_size(c.algo))
    return concat("unknown algorithm code ", static_cast<int>(c.algo));
  if (c.algo == decltype(c.algo){}) {
    if (c.blocks != 0 || c.threads != 0)
      return concat("algorithm none takes blocks 0 and threads 0, got ", c.blocks, " and ",
                    c.threads);
  } else {
    const int max_blocks = info(c.algo).max_blocks;
    if (c.blocks < 1 || c.blocks > max_blocks)
      return concat("blocks ", c.blocks, " out of range 1..", max_blocks);
    if (!is_valid_threads(c.threads))
      return concat("threads ", c.threads, " is not one of 64, 128, 256, 512, 1024");
    if (c.threads > max_threads(c.algo))
      return concat("threads ", c.threads, " is more than ", to_string(c.algo), " takes (",
                    max_threads(c.algo), ")");
  }
  if (!std::isfinite(e.time_us) || e.time_us < 0.0)
    return concat("time_us ", e.time_us, " is not a finite number >= 0");
  return {};
}

/// Decodes the escape whose backslash is at `s[*pos - 1]`, appending the character it stands
/// for to `*value` and advancing `*pos` past it; on error returns false and fills `*err`.
bool read_escape(std::string_view s, std::size_t* pos, std::string* value, std::string* err) {
  std::size_t i = *pos;
  if (i >= s.size()) {
    *err = "unterminated quoted value";
    return false;
  }
  char e = s[i++];
  switch (e) {
    case '"':
      *value += '"';
      break;
    case '\\':
      *value += '\\';
      break;
    case 'n':
      *value += '\n';
      break;
    case 'r':
      *value += '\r';
      break;
    case 't':
      *value += '\t';
      break;
    case 'x': {
      int hi = i < s.size() ? hex_digit(s[i]) : -1;
      int lo = i + 1 < s.size() ? hex_digit(s[i + 1]) : -1;
      if (hi < 0 || lo < 0) {
        *err = "\\x must be followed by two hex digits";
        return false;
      }
      *value += static_cast<char>(hi * 16 + lo);
      i += 2;
      break;
    }
    default:
      *err = detail::concat("unknown escape ", shown(std::string_view(&s[i - 2], 2)));
      return false;
  }
  *pos = i;
  return true;
}

/// Reads the quoted value whose opening quote is at `s[*pos]`, as `read_value` does.
bool read_quoted_value(std::string_view s, std::size_t* pos, std::string* value, std::string* err) {
  std::size_t i = *pos + 1;
  for (;;) {
    if (i >= s.size()) {
      *err = "unterminated quoted value";
      return false;
    }
    char c = s[i++];
    if (c == '"') break;
    if (c != '\\') {
      *value += c;
      continue;
    }
    if (!read_escape(s, &i, value, err)) return false;
  }
  if (i < s.size() && !is_space(s[i])) {
    *err = "a closing quote must be followed by a blank";
    return false;
  }
  *pos = i;
  return true;
}

/// Reads one value of a key line starting at `s[*pos]`: a quoted string or a bare run of
/// non-blank characters. Advances `*pos` past it; on error returns false and fills `*err`.
bool read_value(std::string_view s, std::size_t* pos, std::string* value, std::string* err) {
  value->clear();
  if (*pos < s.size() && s[*pos] == '"') return read_quoted_value(s, pos, value, err);
  std::size_t i = *pos;
  while (i < s.size() && !is_space(s[i])) *value += s[i++];
  *pos = i;
  return true;
}

/// Parses the text after the word `key`. Returns the error, empty on success.
std::string parse_key(std::string_view s, TuneKey* key) {
  using detail::concat;
  struct Field {
    std::string_view name;
    std::string* text = nullptr;
    int* number = nullptr;
    int min = 0;
    bool seen = false;
  };
  Field fields[] = {
      {"gpu", &key->gpu},
      {"world_size", nullptr, &key->world_size, 1},
      {"topology", &key->topology},
      {"driver_version", nullptr, &key->driver_version, 0},
      {"nccl_version", nullptr, &key->nccl_version, 0},
      {"tpcomm_version", &key->tpcomm_version},
  };
  std::size_t i = 0;
  for (;;) {
    while (i < s.size() && is_space(s[i])) ++i;
    if (i >= s.size()) break;
    std::size_t start = i;
    while (i < s.size() && s[i] != '=' && !is_space(s[i])) ++i;
    std::string_view name = s.substr(start, i - start);
    if (i >= s.size() || s[i] != '=') return concat("expected name=value, got ", shown(name));
    ++i;
    Field* f = nullptr;
    for (Field& candidate : fields)
      if (candidate.name == name) f = &candidate;
    if (f == nullptr) return concat("unknown key field ", shown(name));
    if (f->seen) return concat("key field ", name, " given twice");
    f->seen = true;
    std::string value, err;
    if (!read_value(s, &i, &value, &err)) return concat("key field ", name, ": ", err);
    if (f->text != nullptr) {
      *f->text = std::move(value);
      continue;
    }
    auto v = parse_int(value);
    if (!v || *v < f->min || *v > std::numeric_limits<int>::max())
      return concat("key field ", name, " ", shown(value), " is not an integer >= ", f->min);
    *f->number = static_cast<int>(*v);
  }
  for (const Field& f : fields)
    if (!f.seen) return concat("key line lacks ", f.name);
  return {};
}

/// Parses one bucket line. Returns the error, empty on success.
std::string parse_entry(std::string_view line, TuneEntry* e) {
  using detail::concat;
  auto fields = split_fields(line);
  if (fields.size() != 5)
    return concat("expected 5 fields (max_bytes algo blocks threads time_us), got ", fields.size());
  auto max_bytes = parse_int(fields[0]);
  if (!max_bytes || *max_bytes <= 0)
    return concat("max_bytes ", shown(fields[0]), " is not a positive integer");
  auto algo = parse_algo(fields[1]);
  if (!algo)
    return concat("unknown algorithm ", shown(fields[1]), " (expected none, ", algo_names(), ")");
  auto blocks = parse_int(fields[2]);
  if (!blocks || *blocks < 0 || *blocks > std::numeric_limits<int>::max())
    return concat("blocks ", shown(fields[2]), " is not a whole number");
  auto threads = parse_int(fields[3]);
  if (!threads || *threads < 0 || *threads > std::numeric_limits<int>::max())
    return concat("threads ", shown(fields[3]), " is not a whole number");
  auto time_us = parse_double(fields[4]);
  if (!time_us) return concat("time_us ", shown(fields[4]), " is not a number");
  e->max_bytes = *max_bytes;
  e->choice = Choice{*algo, static_cast<int>(*blocks), static_cast<int>(*threads)};
  e->time_us = *time_us;
  return {};
}

/// `entry_error`, and for a fused bucket an algorithm that fuses (or none).
std::string fused_entry_error(const TuneEntry& e, const TuneEntry* prev) {
  if (e.choice.algo != Algo::kNone && !kernels::fuses(info(e.choice.algo).kernel))
    return detail::concat("algorithm ", to_string(e.choice.algo),
                          " cannot serve the fused operation");
  return entry_error(e, prev);
}

/// Parses an exchange bucket line (after the word `exchange`). Returns the error.
std::string parse_exchange_entry(std::string_view line, ExchangeEntry* e) {
  using detail::concat;
  // The same fields as an all-reduce bucket, with an exchange algorithm's name.
  auto fields = split_fields(line);
  if (fields.size() != 5)
    return concat("expected 5 fields (max_bytes algo blocks threads time_us), got ", fields.size());
  std::optional<ExchangeAlgo> algo;
  if (fields[1] == "none") algo = ExchangeAlgo::kNone;
  for (const ExchangeInfo& i : kExchangeAlgorithms)
    if (fields[1] == i.name) algo = i.algo;
  if (!algo)
    return concat("unknown exchange algorithm ", shown(fields[1]), " (expected none, ",
                  exchange_names(), ")");
  // The numbers as an all-reduce bucket's, with a placeholder algorithm.
  TuneEntry numbers;
  const std::string placeholder =
      detail::concat(fields[0], " none ", fields[2], ' ', fields[3], ' ', fields[4]);
  if (auto err = parse_entry(placeholder, &numbers); !err.empty()) return err;
  *e = ExchangeEntry{numbers.max_bytes,
                     ExchangeChoice{*algo, numbers.choice.blocks, numbers.choice.threads},
                     numbers.time_us};
  return {};
}

/// True when `line` starts with the word `word` followed by a blank.
bool starts_with_word(std::string_view line, std::string_view word) {
  return line.starts_with(word) && line.size() > word.size() && is_space(line[word.size()]);
}

}  // namespace

namespace detail {

std::string parse_table_text(std::string_view text, TuneKey* key, std::vector<TuneEntry>* entries,
                             std::vector<TuneEntry>* fused, std::vector<ExchangeEntry>* exchange) {
  using detail::concat;
  if (text.starts_with(kByteOrderMark))
    return "line 1: the file starts with a UTF-8 byte order mark (EF BB BF): save it without one";
  bool have_key = false;
  // NOTE [tune table end]: a table ends with "end N" (N: its bucket lines), so that a file cut
  // short, by a full disk or a copy that stopped, is refused rather than read as a smaller table.
  std::optional<int> end_line;
  auto buckets = [&] {
    return static_cast<std::int64_t>(entries->size() + fused->size() + exchange->size());
  };
  int number = 0;
  std::size_t pos = 0;
  while (pos < text.size() || number == 0) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = trim(text.substr(pos, end - pos));
    pos = end + 1;
    ++number;
    if (number == 1) {
      if (line == kHeader) continue;
      if (line.starts_with(kHeaderPrefix))
        return concat("line 1: unsupported tune table version ",
                      shown(line.substr(kHeaderPrefix.size() - 1)), " (this build reads v",
                      kVersion, ")");
      return concat("line 1: expected the header ", shown(kHeader), ", got ", shown(line));
    }
    if (line.empty() || line.front() == '#') continue;
    if (end_line)
      return concat("line ", number, ": text after the end line (line ", *end_line, ")");
    if (starts_with_word(line, kEnd)) {
      const auto n = parse_int(trim(line.substr(kEnd.size())));
      if (!have_key) return concat("line ", number, ": the end line before the key line");
      if (!n || *n != buckets())
        return concat("line ", number, ": the end line says ", shown(trim(line.substr(3))),
                      " bucket lines; the table has ", buckets());
      end_line = number;
      continue;
    }
    if (line == "key" || (line.starts_with("key") && is_space(line[3]))) {
      if (have_key) return concat("line ", number, ": a second key line");
      if (auto err = parse_key(line.substr(3), key); !err.empty())
        return concat("line ", number, ": ", err);
      have_key = true;
      continue;
    }
    if (!have_key) return concat("line ", number, ": a bucket line before the key line");
    if (starts_with_word(line, kExchange)) {
      ExchangeEntry x;
      if (auto err = parse_exchange_entry(trim(line.substr(kExchange.size())), &x); !err.empty())
        return concat("line ", number, ": ", err);
      if (auto err = entry_error(x, exchange->empty() ? nullptr : &exchange->back()); !err.empty())
        return concat("line ", number, ": ", err);
      exchange->push_back(x);
      continue;
    }
    TuneEntry e;
    if (starts_with_word(line, kFused)) {
      if (auto err = parse_entry(trim(line.substr(kFused.size())), &e); !err.empty())
        return concat("line ", number, ": ", err);
      if (auto err = fused_entry_error(e, fused->empty() ? nullptr : &fused->back()); !err.empty())
        return concat("line ", number, ": ", err);
      fused->push_back(e);
      continue;
    }
    if (auto err = parse_entry(line, &e); !err.empty()) return concat("line ", number, ": ", err);
    if (auto err = entry_error(e, entries->empty() ? nullptr : &entries->back()); !err.empty())
      return concat("line ", number, ": ", err);
    entries->push_back(e);
  }
  if (!have_key) return concat("line ", number, ": end of text without a key line");
  if (!end_line)
    return concat("line ", number, ": end of text without the end line (\"", kEnd, " ", buckets(),
                  "\"): the table was cut short");
  return {};
}

}  // namespace detail

std::string TuneKey::to_text() const {
  return detail::concat("gpu=", format_value(gpu), " world_size=", world_size,
                        " topology=", format_value(topology), " driver_version=", driver_version,
                        " nccl_version=", nccl_version,
                        " tpcomm_version=", format_value(tpcomm_version));
}

std::string TuneKey::difference(const TuneKey& other) const {
  std::string out;
  auto add = [&out](std::string_view name, const std::string& mine, const std::string& theirs) {
    if (mine == theirs) return;
    if (!out.empty()) out += ", ";
    out += detail::concat(name, " ", mine, " != ", theirs);
  };
  add("gpu", format_value(gpu), format_value(other.gpu));
  add("world_size", std::to_string(world_size), std::to_string(other.world_size));
  add("topology", format_value(topology), format_value(other.topology));
  add("driver_version", std::to_string(driver_version), std::to_string(other.driver_version));
  add("nccl_version", std::to_string(nccl_version), std::to_string(other.nccl_version));
  add("tpcomm_version", format_value(tpcomm_version), format_value(other.tpcomm_version));
  return out;
}

TuneTable::TuneTable(TuneKey key, std::vector<TuneEntry> entries, std::vector<TuneEntry> fused,
                     std::vector<ExchangeEntry> exchange)
    : key_(std::move(key)),
      entries_(std::move(entries)),
      fused_(std::move(fused)),
      exchange_(std::move(exchange)) {
  TPCOMM_CHECK(key_.world_size >= 1, Status::kInvalidArgument, "TuneTable: world_size ",
               key_.world_size, " must be at least 1");
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    std::string err = entry_error(entries_[i], i == 0 ? nullptr : &entries_[i - 1]);
    TPCOMM_CHECK(err.empty(), Status::kInvalidArgument, "TuneTable: entry ", i, ": ", err);
  }
  for (std::size_t i = 0; i < fused_.size(); ++i) {
    std::string err = fused_entry_error(fused_[i], i == 0 ? nullptr : &fused_[i - 1]);
    TPCOMM_CHECK(err.empty(), Status::kInvalidArgument, "TuneTable: fused entry ", i, ": ", err);
  }
  for (std::size_t i = 0; i < exchange_.size(); ++i) {
    std::string err = entry_error(exchange_[i], i == 0 ? nullptr : &exchange_[i - 1]);
    TPCOMM_CHECK(err.empty(), Status::kInvalidArgument, "TuneTable: exchange entry ", i, ": ", err);
  }
}

std::int64_t TuneTable::max_bytes() const noexcept {
  return entries_.empty() ? 0 : entries_.back().max_bytes;
}

namespace {

std::optional<Choice> lookup_in(const std::vector<TuneEntry>& entries, std::int64_t bytes) {
  auto it = std::lower_bound(entries.begin(), entries.end(), bytes,
                             [](const TuneEntry& e, std::int64_t b) { return e.max_bytes < b; });
  if (it == entries.end()) return std::nullopt;
  return it->choice;
}

}  // namespace

std::optional<Choice> TuneTable::lookup(std::int64_t bytes) const noexcept {
  return lookup_in(entries_, bytes);
}

std::optional<Choice> TuneTable::lookup_fused(std::int64_t bytes) const noexcept {
  return lookup_in(fused_, bytes);
}

std::optional<ExchangeChoice> TuneTable::lookup_exchange(std::int64_t bytes) const noexcept {
  auto it =
      std::lower_bound(exchange_.begin(), exchange_.end(), bytes,
                       [](const ExchangeEntry& e, std::int64_t b) { return e.max_bytes < b; });
  if (it == exchange_.end()) return std::nullopt;
  return it->choice;
}

std::vector<std::int64_t> TuneTable::bucket_bounds(std::int64_t max_bytes) {
  TPCOMM_CHECK(max_bytes > 0, Status::kInvalidArgument, "bucket_bounds: max_bytes ", max_bytes,
               " is not positive");
  constexpr std::int64_t kFirst = 512;
  std::vector<std::int64_t> bounds;
  std::int64_t b = kFirst;
  while (b <= max_bytes) {
    bounds.push_back(b);
    if (b > max_bytes / 2) break;  // b * 2 > max_bytes, and doubling could overflow
    b *= 2;
  }
  if (bounds.empty() || bounds.back() != max_bytes) bounds.push_back(max_bytes);
  return bounds;
}

std::string TuneTable::to_text() const {
  std::string out;
  out += kHeader;
  out += "\nkey ";
  out += key_.to_text();
  out += '\n';
  out += kColumns;
  out += '\n';
  auto line = [&](const TuneEntry& e) {
    out += detail::concat(e.max_bytes, ' ', to_string(e.choice.algo), ' ', e.choice.blocks, ' ',
                          e.choice.threads, ' ', format_double(e.time_us), '\n');
  };
  for (const TuneEntry& e : entries_) line(e);
  for (const TuneEntry& e : fused_) {
    out += kFused;
    out += ' ';
    line(e);
  }
  for (const ExchangeEntry& e : exchange_)
    out +=
        detail::concat(kExchange, ' ', e.max_bytes, ' ', to_string(e.choice.algo), ' ',
                       e.choice.blocks, ' ', e.choice.threads, ' ', format_double(e.time_us), '\n');
  out += detail::concat(kEnd, ' ', entries_.size() + fused_.size() + exchange_.size(), '\n');
  return out;
}

TuneTable TuneTable::parse(std::string_view text) {
  TuneKey key;
  std::vector<TuneEntry> entries, fused;
  std::vector<ExchangeEntry> exchange;
  std::string err = detail::parse_table_text(text, &key, &entries, &fused, &exchange);
  if (!err.empty()) TPCOMM_THROW(Status::kProtocolError, "tune table ", err);
  return TuneTable(std::move(key), std::move(entries), std::move(fused), std::move(exchange));
}

}  // namespace tpcomm
