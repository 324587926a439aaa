// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "core/cuda_driver.hpp"
#include "core/dl.hpp"
#include "tpcomm/status.hpp"

namespace tpcomm {
namespace {

TEST(DynamicLibrary, MissingLibraryIsAClearError) {
  try {
    DynamicLibrary lib("libtpcomm-does-not-exist.so.9");
    FAIL() << "loading a missing library succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("libtpcomm-does-not-exist.so.9"), std::string::npos)
        << e.what();
  }
}

TEST(DynamicLibrary, FindsAndMissesSymbols) {
  DynamicLibrary libc("libc.so.6");
  EXPECT_NE(libc.find("strlen"), nullptr);
  EXPECT_EQ(libc.find("tpcomm_no_such_symbol"), nullptr);
  try {
    (void)libc.require("tpcomm_no_such_symbol");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("tpcomm_no_such_symbol"), std::string::npos);
  }
  EXPECT_NE(libc.resolved_path().find("libc"), std::string::npos);
}

TEST(DynamicLibrary, TryOpenExplainsInsteadOfThrowing) {
  std::string why;
  EXPECT_FALSE(DynamicLibrary::try_open("libtpcomm-does-not-exist.so.9", &why).has_value());
  EXPECT_NE(why.find("libtpcomm-does-not-exist.so.9"), std::string::npos) << why;
  auto libc = DynamicLibrary::try_open("libc.so.6");
  ASSERT_TRUE(libc.has_value());
  EXPECT_NE(libc->find("strlen"), nullptr);
}

// On a machine without a driver the table reports why; with one it resolves every symbol.
TEST(CudaDriver, LoadsOrExplains) {
  std::string why;
  const CudaDriver* d = CudaDriver::try_get(&why);
  if (d == nullptr) {
    // A phrase that reads after "CUDA driver: ", as `tpcomm info` prints it.
    EXPECT_TRUE(why.rfind("not found (", 0) == 0 || why.rfind("too old (", 0) == 0 ||
                why.rfind("cuInit failed (", 0) == 0)
        << why;
    EXPECT_THROW(CudaDriver::get(), Error);
  } else {
    EXPECT_NE(d->cuDeviceGetCount, nullptr);
    int version = 0;
    EXPECT_EQ(d->cuDriverGetVersion(&version), CUDA_SUCCESS);
    EXPECT_GT(version, 0);
  }
}

}  // namespace
}  // namespace tpcomm
