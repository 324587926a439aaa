// SPDX-License-Identifier: Apache-2.0
// dlopen/dlsym with errors that say what was missing.
#pragma once

#include <string>

namespace tpcomm {

/// An open shared library; closes it on destruction. Move-only.
class DynamicLibrary {
 public:
  /// Opens `path` (a soname or a path) with RTLD_NOW | RTLD_LOCAL. Throws
  /// `Error(kUnavailable)` carrying dlerror()'s text when it cannot be opened.
  explicit DynamicLibrary(const std::string& path);
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
  void* handle_ = nullptr;
  std::string path_;
};

}  // namespace tpcomm
