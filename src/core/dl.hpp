// SPDX-License-Identifier: Apache-2.0
// dlopen/dlsym with errors that say what was missing.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace tpcomm {

/// An open shared library; closes it on destruction. Move-only.
class DynamicLibrary {
 public:
  /// Opens `path` (a soname or a path) with RTLD_NOW | RTLD_LOCAL. Throws
  /// `Error(kUnavailable)` carrying dlerror()'s text when it cannot be opened.
  explicit DynamicLibrary(const std::string& path);
  /// Like the constructor, but returns nullopt and stores dlerror()'s text in `why` (when not
  /// null) instead of throwing: for optional libraries whose absence is not an error.
  static std::optional<DynamicLibrary> try_open(const std::string& path,
                                                std::string* why = nullptr);
  ~DynamicLibrary();
  DynamicLibrary(DynamicLibrary&& other) noexcept;
  DynamicLibrary& operator=(DynamicLibrary&& other) noexcept;
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;

  /// The address of `name`, or nullptr when the library does not export it.
  [[nodiscard]] void* find(const char* name) const noexcept;
  /// The address of `name`; throws `Error(kUnavailable)` naming the symbol and library.
  [[nodiscard]] void* require(const char* name) const;
  /// The path as given to the constructor.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// The file the dynamic loader actually opened (from dlinfo), or `path()` if unknown.
  [[nodiscard]] std::string resolved_path() const;

 private:
  DynamicLibrary(void* handle, std::string path) noexcept
      : handle_(handle), path_(std::move(path)) {}
  /// dlopen with RTLD_NOW | RTLD_LOCAL; nullptr and dlerror()'s text in `why` on failure.
  static void* open_handle(const std::string& path, std::string& why);

  void* handle_ = nullptr;
  std::string path_;
};

}  // namespace tpcomm
