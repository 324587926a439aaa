// SPDX-License-Identifier: Apache-2.0
#include "core/nvml.hpp"

#include <gtest/gtest.h>

#include <string>

namespace tpcomm {
namespace {

TEST(PciBusId, ParsesCudaAndNvmlSpellings) {
  EXPECT_EQ(parse_pci_bus_id("0000:3b:00.0"), (PciAddress{0, 0x3b, 0, 0}));
  EXPECT_EQ(parse_pci_bus_id("00000000:3B:00.0"), (PciAddress{0, 0x3b, 0, 0}));
  EXPECT_EQ(parse_pci_bus_id("3b:00.0"), (PciAddress{0, 0x3b, 0, 0}));
  EXPECT_EQ(parse_pci_bus_id("0001:C1:1f.7"), (PciAddress{1, 0xc1, 0x1f, 7}));
  EXPECT_EQ(parse_pci_bus_id("0000:3b:00.0"), parse_pci_bus_id("00000000:3B:00.0"));
}

TEST(PciBusId, RejectsMalformedIds) {
  for (const char* bad : {"", "3b:00", "zz:00.0", "0000:3b:20.0", "0000:3b:00.8",
                          "000000000:3b:00.0", "0000:3b:00.", "0000::00.0", "0000:3b:00.0x"}) {
    EXPECT_EQ(parse_pci_bus_id(bad), std::nullopt) << bad;
  }
}

// Absent NVML is not an error: the table says why, in a phrase `tpcomm info` prints as is.
TEST(Nvml, LoadsOrExplains) {
  std::string why;
  const Nvml* nvml = Nvml::try_get(&why);
  if (nvml == nullptr) {
    EXPECT_TRUE(why.rfind("not found (", 0) == 0 || why.rfind("too old (", 0) == 0 ||
                why.rfind("nvmlInit failed (", 0) == 0)
        << why;
  } else {
    EXPECT_FALSE(nvml->driver_version().empty());
    EXPECT_EQ(nvml->device("not a bus id"), std::nullopt);
  }
}

}  // namespace
}  // namespace tpcomm
