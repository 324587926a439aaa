// SPDX-License-Identifier: Apache-2.0
#include "core/dl.hpp"

#include <dlfcn.h>
#include <link.h>

#include <utility>

#include "core/check.hpp"

namespace tpcomm {

void* DynamicLibrary::open_handle(const std::string& path, std::string& why) {
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* text = dlerror();
    why = text != nullptr ? text : path + ": unknown dlopen error";
  }
  return handle;
}

DynamicLibrary::DynamicLibrary(const std::string& path) : path_(path) {
  std::string why;
  handle_ = open_handle(path, why);
  if (handle_ == nullptr) TPCOMM_THROW(Status::kUnavailable, "cannot load ", path, ": ", why);
}

std::optional<DynamicLibrary> DynamicLibrary::try_open(const std::string& path, std::string* why) {
  std::string text;
  void* handle = open_handle(path, text);
  if (handle == nullptr) {
    if (why != nullptr) *why = std::move(text);
    return std::nullopt;
  }
  return DynamicLibrary(handle, path);
}

DynamicLibrary::~DynamicLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

DynamicLibrary::DynamicLibrary(DynamicLibrary&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), path_(std::move(other.path_)) {}

DynamicLibrary& DynamicLibrary::operator=(DynamicLibrary&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

void* DynamicLibrary::find(const char* name) const noexcept {
  return handle_ == nullptr ? nullptr : dlsym(handle_, name);
}

void* DynamicLibrary::require(const char* name) const {
  void* p = find(name);
  TPCOMM_CHECK(p != nullptr, Status::kUnavailable, path_, " does not export ", name);
  return p;
}

std::string DynamicLibrary::resolved_path() const {
  link_map* map = nullptr;
  if (handle_ != nullptr && dlinfo(handle_, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr &&
      map->l_name != nullptr && map->l_name[0] != '\0') {
    return map->l_name;
  }
  return path_;
}

}  // namespace tpcomm
