// SPDX-License-Identifier: Apache-2.0
// TuneTable's cache file: read only from a regular file of bounded size, written atomically
// (a temporary file renamed over the target), and where it lives by default.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

#include "core/check.hpp"
#include "core/parse.hpp"
#include "tune/table.hpp"

namespace tpcomm {
namespace {

/// A version-1 table is a few kilobytes; anything much larger is not one (or is /dev/zero).
constexpr std::size_t kMaxFileBytes = std::size_t{1} << 20;

std::string errno_text(int err) { return std::system_category().message(err); }

/// "not a regular file (a FIFO)", for a file of mode `mode` that is not a regular file.
std::string not_regular(mode_t mode) {
  const char* kind = S_ISDIR(mode)    ? "a directory"
                     : S_ISFIFO(mode) ? "a FIFO"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                                      : "a special file";
  return detail::concat("not a regular file (", kind, ")");
}

// NOTE [tune temporary files]
// A save writes `.NAME.tmp-XXXXXX` next to the target, then renames it over the target. A save
// killed in between leaves that file behind, so each save first removes the temporary files of
// its own target (that exact prefix and six characters after it) that are regular files last
// modified more than kStaleTemporary ago. Age, not a process id, decides: the cache directory
// may be shared by several hosts (a home directory over NFS), where a process id means nothing,
// and a save takes milliseconds, so a temporary file a minute old belongs to no save in
// progress.
constexpr std::string_view kTemporaryInfix = ".tmp-";
constexpr std::chrono::seconds kStaleTemporary{60};

std::string temporary_prefix(const std::filesystem::path& target) {
  std::string prefix(".");
  prefix += target.filename().string();
  prefix += kTemporaryInfix;
  return prefix;
}

/// Removes the stale temporary files of `target` in `dir` (see the note above); best effort.
void remove_stale_temporaries(const std::filesystem::path& dir,
                              const std::filesystem::path& target) noexcept {
  try {
    const std::string prefix = temporary_prefix(target);
    const auto now = std::chrono::system_clock::now();
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.size() != prefix.size() + 6 || !name.starts_with(prefix)) continue;
      struct stat st {};
      if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      const auto modified = std::chrono::system_clock::from_time_t(st.st_mtime);
      if (now - modified > kStaleTemporary) ::unlink(it->path().c_str());
    }
  } catch (...) {
    // A cache that cannot be tidied is still a cache.
  }
}

/// Removes a temporary file unless released.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  ~TempFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  void release() noexcept { path_.clear(); }

 private:
  std::string path_;
};

std::string slug(std::string_view name) {
  std::string out;
  for (char c : name) {
    bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (alnum) {
      out += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "unknown" : out;
}

}  // namespace

std::optional<TuneTable> TuneTable::load(const std::string& path, const TuneKey& expected,
                                         std::string* why) {
  auto fail = [why](std::string reason) -> std::optional<TuneTable> {
    if (why != nullptr) *why = std::move(reason);
    return std::nullopt;
  };
  // Only a regular file is read: opening a FIFO would wait for a writer, and a device could
  // block or never end. stat() refuses them before the open; the open cannot block
  // (O_NONBLOCK), and fstat() on what was opened closes the race with a rename in between.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return fail("no such file");
    return fail("cannot open: " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) return fail(not_regular(st.st_mode));
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return fail("no such file");
    return fail("cannot open: " + errno_text(err));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &st) != 0) return fail("cannot read: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) return fail(not_regular(st.st_mode));
  std::string text;
  char buf[8192];
  while (text.size() <= kMaxFileBytes) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("cannot read: " + errno_text(errno));
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  if (text.size() > kMaxFileBytes)
    return fail(detail::concat("larger than ", format_bytes(kMaxFileBytes)));
  TuneKey key;
  std::vector<TuneEntry> entries, fused;
  std::vector<ExchangeEntry> exchange;
  if (std::string err = detail::parse_table_text(text, &key, &entries, &fused, &exchange);
      !err.empty())
    return fail("malformed: " + err);
  if (key != expected) return fail("key differs: " + key.difference(expected));
  return TuneTable(std::move(key), std::move(entries), std::move(fused), std::move(exchange));
}

void TuneTable::save(const std::string& path) const {
  namespace fs = std::filesystem;
  const fs::path target(path);
  TPCOMM_CHECK(!path.empty() && target.has_filename(), Status::kSystemError,
               "cannot write tune file \"", path, "\": not a file path");
  // rename() would replace a device node, a FIFO or a directory's entry with a regular file:
  // only a regular file (or nothing) may be replaced. stat() does not block on any of them.
  if (struct stat st{}; ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    TPCOMM_THROW(Status::kSystemError, "cannot write tune file \"", path,
                 "\": ", not_regular(st.st_mode));
  }
  fs::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  fs::create_directories(dir, ec);
  TPCOMM_CHECK(!ec, Status::kSystemError, "cannot create directory ", dir, " for tune file \"",
               path, "\": ", ec.message());

  // The temporary file sits next to the target so that rename() is atomic (same file system);
  // see NOTE [tune temporary files] for its name.
  remove_stale_temporaries(dir, target);
  std::string tmp = (dir / (temporary_prefix(target) + "XXXXXX")).string();
  int fd = ::mkstemp(tmp.data());
  TPCOMM_CHECK(fd >= 0, Status::kSystemError, "cannot create a temporary file in ", dir,
               " for tune file \"", path, "\": ", errno_text(errno));
  TempFile guard(tmp);
  auto fail = [&](const char* what) {
    int err = errno;
    ::close(fd);
    TPCOMM_THROW(Status::kSystemError, "cannot write tune file \"", path, "\" (", what,
                 "): ", errno_text(err));
  };
  const std::string text = to_text();
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write");
    done += static_cast<std::size_t>(n);
  }
  // mkstemp creates the file 0600; a cache file is as readable as any other file.
  if (::fchmod(fd, 0644) != 0) fail("fchmod");
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) {
    int err = errno;
    TPCOMM_THROW(Status::kSystemError, "cannot write tune file \"", path,
                 "\" (close): ", errno_text(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    TPCOMM_THROW(Status::kSystemError, "cannot write tune file \"", path,
                 "\" (rename): ", errno_text(err));
  }
  guard.release();
  // Make the rename itself durable; a failure here loses at most the new cache entry.
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

std::string default_tune_path(
    const TuneKey& key, const std::function<std::optional<std::string>(const char*)>& getenv) {
  auto absolute = [&getenv](const char* name) -> std::optional<std::string> {
    auto v = getenv(name);
    if (!v || v->empty() || v->front() != '/') return std::nullopt;
    return v;
  };
  std::filesystem::path dir;
  if (auto xdg = absolute("XDG_CACHE_HOME")) {
    dir = std::filesystem::path(*xdg) / "tpcomm";
  } else if (auto home = absolute("HOME")) {
    dir = std::filesystem::path(*home) / ".cache" / "tpcomm";
  } else {
    dir = "/tmp/tpcomm-cache";
  }
  return (dir / detail::concat("tune-w", key.world_size, "-", slug(key.gpu), ".txt")).string();
}

std::string default_tune_path(const TuneKey& key) {
  return default_tune_path(key, [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

std::string tune_path(const Options& options, const TuneKey& key) {
  if (!options.tune_file.empty()) return options.tune_file;
  return default_tune_path(key);
}

}  // namespace tpcomm
