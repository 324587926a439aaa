// SPDX-License-Identifier: Apache-2.0
// Writing a JSON report to a file, with every write error reported.
#pragma once

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>

namespace tpcomm::tools {

/// Writes `doc`, indented by two spaces and followed by a newline, to `path` (created or
/// truncated). Returns "" on success, else why not: the system error of the open, the write or
/// the close, so that a full disk (which often shows only when the buffer is flushed at the
/// close) is not taken for success.
/// "" when `path` can be written, else why not; checked before a long run so that a bad path is
/// reported at once, not after it. The file is opened for appending, which leaves one that exists
/// as it is, and removed again when the check created it.
inline std::string check_writable(const std::string& path) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return "cannot open: " + std::system_category().message(errno);
  std::fclose(f);
  if (!existed) std::remove(path.c_str());
  return {};
}

inline std::string write_json_file(const std::string& path, const nlohmann::json& doc) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return "cannot open: " + std::system_category().message(errno);
  const std::string text = doc.dump(2) + "\n";
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int write_err = wrote ? 0 : errno;
  const bool closed = std::fclose(f) == 0;
  const int close_err = closed ? 0 : errno;
  if (!wrote) return "cannot write: " + std::system_category().message(write_err);
  if (!closed) return "cannot write: " + std::system_category().message(close_err);
  return {};
}

}  // namespace tpcomm::tools
