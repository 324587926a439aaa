// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/child.hpp"
#include "support/tune_tables.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/status.hpp"
#include "tune/table.hpp"

namespace tpcomm {
namespace {

namespace fs = std::filesystem;

using testing::expect_error;
using testing::h200_key;
using testing::kGoodHead;
using testing::kKiB;
using testing::kMiB;
using testing::numbered_table;

int blocks_at(const TuneTable& t, std::int64_t bytes) {
  auto c = t.lookup(bytes);
  return c ? c->blocks : -1;
}

// ---------------------------------------------------------------------------------------------
// Buckets and lookup

TEST(TuneTable, BucketBoundsArePowersOfTwoFrom512) {
  auto b = TuneTable::bucket_bounds(8 * kMiB);
  ASSERT_EQ(b.size(), 15u);  // 2^9 .. 2^23
  for (std::size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i], std::int64_t{512} << i);
  EXPECT_EQ(TuneTable::bucket_bounds(512), (std::vector<std::int64_t>{512}));
  EXPECT_EQ(TuneTable::bucket_bounds(513), (std::vector<std::int64_t>{512, 513}));
  EXPECT_EQ(TuneTable::bucket_bounds(1024), (std::vector<std::int64_t>{512, 1024}));
  EXPECT_EQ(TuneTable::bucket_bounds(3000), (std::vector<std::int64_t>{512, 1024, 2048, 3000}));
  EXPECT_EQ(TuneTable::bucket_bounds(8 * kMiB - 1).back(), 8 * kMiB - 1);
  EXPECT_EQ(TuneTable::bucket_bounds(8 * kMiB - 1).size(), 15u);
  // Below the first power of two: a single bucket.
  EXPECT_EQ(TuneTable::bucket_bounds(100), (std::vector<std::int64_t>{100}));
  EXPECT_EQ(TuneTable::bucket_bounds(1), (std::vector<std::int64_t>{1}));
  // No overflow at the top of the range.
  auto top = TuneTable::bucket_bounds(std::numeric_limits<std::int64_t>::max());
  ASSERT_EQ(top.size(), 55u);  // 2^9 .. 2^62, then the maximum
  EXPECT_EQ(top[top.size() - 2], std::int64_t{1} << 62);
  EXPECT_EQ(top.back(), std::numeric_limits<std::int64_t>::max());
  expect_error([] { (void)TuneTable::bucket_bounds(0); }, Status::kInvalidArgument, "max_bytes");
  expect_error([] { (void)TuneTable::bucket_bounds(-512); }, Status::kInvalidArgument, "max_bytes");
}

TEST(TuneTable, LookupAtEveryEdge) {
  const TuneTable t = numbered_table(8 * kMiB);
  EXPECT_EQ(t.max_bytes(), 8 * kMiB);
  // At most the first bound: the first bucket.
  EXPECT_EQ(blocks_at(t, 0), 1);
  EXPECT_EQ(blocks_at(t, 1), 1);
  EXPECT_EQ(blocks_at(t, 511), 1);
  EXPECT_EQ(blocks_at(t, 512), 1);
  EXPECT_EQ(blocks_at(t, 513), 2);
  // Each power of two belongs to its own bucket; one byte more goes to the next.
  int bucket = 1;
  for (std::int64_t b = 512; b <= 8 * kMiB; b *= 2, ++bucket) {
    EXPECT_EQ(blocks_at(t, b), bucket) << b;
    EXPECT_EQ(blocks_at(t, b - 1), b == 512 ? 1 : bucket) << b - 1;
    if (b < 8 * kMiB) {
      EXPECT_EQ(blocks_at(t, b + 1), bucket + 1) << b + 1;
    }
  }
  EXPECT_EQ(blocks_at(t, 8 * kMiB), 15);
  EXPECT_FALSE(t.lookup(8 * kMiB + 1).has_value());
  EXPECT_FALSE(t.lookup(std::numeric_limits<std::int64_t>::max()).has_value());
  // The lookup returns the whole choice.
  EXPECT_EQ(t.lookup(1000), (Choice{Algo::kOneShot, 2, 512}));
  EXPECT_EQ(t.lookup(4 * kMiB), (Choice{Algo::kTwoShot, 14, 512}));
}

TEST(TuneTable, LookupWithANonPowerOfTwoMaximum) {
  const TuneTable t = numbered_table(3000);
  EXPECT_EQ(blocks_at(t, 2048), 3);
  EXPECT_EQ(blocks_at(t, 2049), 4);
  EXPECT_EQ(blocks_at(t, 3000), 4);
  EXPECT_FALSE(t.lookup(3001).has_value());
}

TEST(TuneTable, EmptyTableCoversNothing) {
  TuneTable t;
  EXPECT_EQ(t.max_bytes(), 0);
  EXPECT_FALSE(t.lookup(1).has_value());
  EXPECT_FALSE(t.lookup(0).has_value());
}

TEST(TuneTable, ConstructorRejectsBadEntries) {
  const Choice ok{Algo::kOneShot, 4, 512};
  struct Bad {
    std::vector<TuneEntry> entries;
    const char* needle;
  };
  const std::vector<Bad> bad = {
      {{{1024, ok, 1}, {512, ok, 1}}, "entry 1: bucket 512 follows bucket 1024"},
      {{{512, ok, 1}, {512, ok, 1}}, "entry 1: duplicate bucket 512"},
      {{{0, ok, 1}}, "entry 0: max_bytes 0 is not positive"},
      {{{512, Choice{Algo::kTwoShot, 0, 512}, 1}}, "blocks 0 out of range 1..64"},
      {{{512, Choice{Algo::kTwoShot, 65, 512}, 1}}, "blocks 65 out of range 1..64"},
      {{{512, Choice{Algo::kOneShot, 4, 96}, 1}}, "threads 96 is not one of"},
      {{{512, Choice{Algo::kLamport, 4, 1024}, 1}},
       "threads 1024 is more than lamport takes (512)"},
      {{{512, Choice{Algo::kNone, 4, 512}, 1}}, "algorithm none takes blocks 0 and threads 0"},
      {{{512, ok, -1}}, "time_us -1"},
      {{{512, ok, std::numeric_limits<double>::quiet_NaN()}}, "time_us nan"},
      {{{512, ok, std::numeric_limits<double>::infinity()}}, "time_us inf"},
      {{{512, Choice{static_cast<Algo>(7), 4, 512}, 1}}, "unknown algorithm code 7"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.needle);
    expect_error([&] { TuneTable(h200_key(), b.entries); }, Status::kInvalidArgument, b.needle);
  }
  expect_error([] { TuneTable(TuneKey{}, {}); }, Status::kInvalidArgument, "world_size 0");
  // NCCL winning a bucket is a valid entry.
  EXPECT_EQ(TuneTable(h200_key(), {{512, Choice{}, 9.5}}).lookup(100), Choice{});
}

// ---------------------------------------------------------------------------------------------
// Key

TEST(TuneKey, TextAndDifference) {
  TuneKey k = h200_key();
  EXPECT_EQ(k.to_text(),
            "gpu=\"NVIDIA H200\" world_size=8 topology=nvlink-full driver_version=12040 "
            "nccl_version=22703 tpcomm_version=0.1.0");
  EXPECT_EQ(k.difference(k), "");
  TuneKey other = k;
  other.world_size = 4;
  EXPECT_EQ(k.difference(other), "world_size 8 != 4");
  other.gpu = "NVIDIA H100 80GB HBM3";
  other.nccl_version = 22805;
  EXPECT_EQ(k.difference(other),
            "gpu \"NVIDIA H200\" != \"NVIDIA H100 80GB HBM3\", world_size 8 != 4, "
            "nccl_version 22703 != 22805");
  TuneKey empty = k;
  empty.topology = "";
  EXPECT_EQ(empty.difference(k), "topology \"\" != nvlink-full");
}

// ---------------------------------------------------------------------------------------------
// Text format

TEST(TuneTableText, ExactFormOfASmallTable) {
  TuneTable t(h200_key(), {{256, Choice{Algo::kLamport, 1, 256}, 2.5},
                           {512, Choice{Algo::kOneShot, 1, 512}, 4.5},
                           {1024, Choice{Algo::kTwoShot, 2, 256}, 10},
                           {1536, Choice{Algo::kLamportTwoShot, 4, 512}, 7},
                           {2048, Choice{}, 0.125}});
  EXPECT_EQ(t.to_text(), kGoodHead +
                             "# max_bytes algo blocks threads time_us\n"
                             "256 lamport 1 256 2.5\n"
                             "512 one_shot 1 512 4.5\n"
                             "1024 two_shot 2 256 10\n"
                             "1536 lamport_two_shot 4 512 7\n"
                             "2048 none 0 0 0.125\n"
                             "end 5\n");
}

TEST(TuneTableText, RoundTrip) {
  TuneTable t = numbered_table(8 * kMiB);
  EXPECT_EQ(TuneTable::parse(t.to_text()), t);

  // Awkward key strings and times survive too.
  TuneKey k{
      "GPU \"quoted\" \\ back\\slash\ttab\nnewline \x01\x7f é", 2, "", 0, 0, "1.2.3-rc1+g0abc"};
  std::vector<TuneEntry> e{{512, Choice{Algo::kOneShot, 64, 1024}, 0.1},
                           {4096, Choice{Algo::kTwoShot, 1, 64}, 1e-7},
                           {1 << 20, Choice{}, 123456.78901234567},
                           {std::numeric_limits<std::int64_t>::max(), Choice{}, 0}};
  TuneTable odd(k, e);
  TuneTable back = TuneTable::parse(odd.to_text());
  EXPECT_EQ(back, odd);
  EXPECT_EQ(back.key().gpu, k.gpu);
  EXPECT_EQ(back.entries()[2].time_us, 123456.78901234567);
  EXPECT_EQ(TuneTable::parse(TuneTable(k, {}).to_text()), TuneTable(k, {}));
}

TEST(TuneTableText, AcceptsCommentsBlanksCrlfAndSpacing) {
  std::string text =
      "# tpcomm tune table v2\r\n"
      "\r\n"
      "# measured on a test box\n"
      "   # an indented comment\n"
      "key   tpcomm_version=\"0.1.0\" gpu=\"NVIDIA H200\"\tworld_size=8 topology=\"nvlink-full\" "
      "nccl_version=22703 driver_version=12040\r\n"
      "\n"
      "512\tone_shot  1 512 4.5   \r\n"
      "  1024 two_shot 2 256 1e1\n"
      "2048 none 0 0 0\n"
      "# the end\n"
      "end  3";  // no final newline
  TuneTable t = TuneTable::parse(text);
  EXPECT_EQ(t.key(), h200_key());
  ASSERT_EQ(t.entries().size(), 3u);
  EXPECT_EQ(t.entries()[1], (TuneEntry{1024, Choice{Algo::kTwoShot, 2, 256}, 10}));
  EXPECT_EQ(t.entries()[2].choice, Choice{});
}

struct Malformed {
  const char* what;
  std::string text;
  const char* needle;  // expected in the message, after "line N: "
  int line;
};

TEST(TuneTableText, RejectsEveryMalformedInputWithItsLineNumber) {
  const std::string head = kGoodHead;  // lines 1 and 2
  const std::string key_prefix = "# tpcomm tune table v2\nkey ";
  const std::string full_key =
      "gpu=g world_size=8 topology=t driver_version=1 nccl_version=2 tpcomm_version=v";
  const std::vector<Malformed> cases = {
      {"empty", "", "expected the header", 1},
      {"no header", "key gpu=g\n", "expected the header", 1},
      {"other version", "# tpcomm tune table v1\n", "unsupported tune table version \"v1\"", 1},
      {"header only", "# tpcomm tune table v2\n", "without a key line", 1},
      {"comments only", "# tpcomm tune table v2\n# x\n\n", "without a key line", 3},
      {"bucket before key", "# tpcomm tune table v2\n# c\n512 one_shot 1 512 1\n",
       "bucket line before the key line", 3},
      {"second key", head + "key " + full_key + "\n", "second key line", 3},
      {"unknown key field", key_prefix + full_key + " colour=blue\n", "unknown key field", 2},
      {"key field twice", key_prefix + full_key + " gpu=h\n", "key field gpu given twice", 2},
      {"key field missing", key_prefix + "gpu=g world_size=8\n", "key line lacks topology", 2},
      {"empty key", key_prefix + "\n", "key line lacks gpu", 2},
      {"key without =", key_prefix + "gpu\n", "expected name=value", 2},
      {"world_size not a number",
       key_prefix +
           "gpu=g world_size=eight topology=t driver_version=1 nccl_version=2 tpcomm_version=v\n",
       "world_size \"eight\" is not an integer >= 1", 2},
      {"world_size zero",
       key_prefix +
           "gpu=g world_size=0 topology=t driver_version=1 nccl_version=2 tpcomm_version=v\n",
       "world_size \"0\" is not an integer >= 1", 2},
      {"driver_version too large",
       key_prefix + "gpu=g world_size=8 topology=t driver_version=99999999999 nccl_version=2 "
                    "tpcomm_version=v\n",
       "driver_version", 2},
      {"negative nccl_version",
       key_prefix +
           "gpu=g world_size=8 topology=t driver_version=1 nccl_version=-2 tpcomm_version=v\n",
       "nccl_version", 2},
      {"unterminated quote", key_prefix + "gpu=\"NVIDIA H200\n", "unterminated quoted value", 2},
      {"backslash at end", key_prefix + "gpu=\"abc\\", "unterminated quoted value", 2},
      {"unknown escape", key_prefix + "gpu=\"a\\qb\" \n", "unknown escape", 2},
      {"short hex escape", key_prefix + "gpu=\"a\\x4\" \n", "two hex digits", 2},
      {"text after quote", key_prefix + "gpu=\"a\"b\n", "closing quote", 2},
      {"too few fields", head + "512 one_shot 1 512\n", "expected 5 fields", 3},
      {"too many fields", head + "512 one_shot 1 512 4.5 extra\n", "got 6", 3},
      {"max_bytes not a number", head + "5x2 one_shot 1 512 4.5\n",
       "max_bytes \"5x2\" is not a positive integer", 3},
      {"max_bytes zero", head + "0 one_shot 1 512 4.5\n", "max_bytes \"0\"", 3},
      {"max_bytes negative", head + "-512 one_shot 1 512 4.5\n", "max_bytes \"-512\"", 3},
      {"max_bytes overflow", head + "99999999999999999999 one_shot 1 512 4.5\n", "max_bytes", 3},
      {"unknown algo", head + "512 three_shot 1 512 4.5\n",
       "unknown algorithm \"three_shot\" (expected none, one_shot, two_shot, lamport, "
       "lamport_two_shot)",
       3},
      {"algo case", head + "512 One_Shot 1 512 4.5\n", "unknown algorithm", 3},
      {"blocks not a number", head + "512 one_shot many 512 4.5\n", "blocks \"many\"", 3},
      {"blocks zero", head + "512 one_shot 0 512 4.5\n", "blocks 0 out of range 1..64", 3},
      {"blocks too many", head + "512 two_shot 129 512 4.5\n", "blocks 129 out of range", 3},
      {"blocks negative", head + "512 two_shot -1 512 4.5\n", "blocks \"-1\"", 3},
      {"threads not a number", head + "512 one_shot 1 5l2 4.5\n", "threads \"5l2\"", 3},
      {"threads not a block size", head + "512 one_shot 1 500 4.5\n", "threads 500 is not one of",
       3},
      {"threads too many", head + "512 one_shot 1 2048 4.5\n", "threads 2048", 3},
      {"threads past the kernel's", head + "512 lamport_two_shot 1 1024 4.5\n",
       "threads 1024 is more than lamport_two_shot takes (512)", 3},
      {"none with a launch", head + "512 none 4 512 4.5\n", "algorithm none takes blocks 0", 3},
      {"time not a number", head + "512 one_shot 1 512 fast\n", "time_us \"fast\" is not a number",
       3},
      {"time nan", head + "512 one_shot 1 512 nan\n", "time_us", 3},
      {"time inf", head + "512 one_shot 1 512 inf\n", "time_us", 3},
      {"time negative", head + "512 one_shot 1 512 -4.5\n", "time_us -4.5", 3},
      {"time with unit", head + "512 one_shot 1 512 4.5us\n", "time_us \"4.5us\"", 3},
      {"unsorted", head + "# c\n1024 one_shot 1 512 1\n512 one_shot 1 512 1\n",
       "bucket 512 follows bucket 1024", 5},
      {"duplicate", head + "512 one_shot 1 512 1\n\n512 two_shot 1 512 1\n", "duplicate bucket 512",
       5},
      {"binary junk", head + std::string("\x00\xff\x01 \x80", 5) + "\n", "expected 5 fields", 3},
      {"junk token shown shortened", head + std::string(500, 'x') + " one_shot 1 512 1\n", "...",
       3},
      {"cut short", head + "512 one_shot 1 512 1\n1024 one_shot 1 512 1\n",
       "end of text without the end line (\"end 2\"): the table was cut short", 4},
      {"cut inside the end line", head + "512 one_shot 1 512 1\nen", "expected 5 fields", 4},
      {"end counts other lines", head + "512 one_shot 1 512 1\nend 2\n",
       "the end line says \"2\" bucket lines; the table has 1", 4},
      {"end without a count", head + "512 one_shot 1 512 1\nend\n", "expected 5 fields", 4},
      {"text after the end", head + "512 one_shot 1 512 1\nend 1\n1024 one_shot 1 512 1\n",
       "text after the end line (line 4)", 5},
      {"end before the key", "# tpcomm tune table v2\nend 0\n", "end line before the key line", 2},
      {"byte order mark", "\xEF\xBB\xBF" + head + "end 0\n",
       "starts with a UTF-8 byte order mark (EF BB BF)", 1},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    expect_error([&] { (void)TuneTable::parse(c.text); }, Status::kProtocolError,
                 "tune table line " + std::to_string(c.line) + ": ");
    expect_error([&] { (void)TuneTable::parse(c.text); }, Status::kProtocolError, c.needle);
  }
}

// Whatever the bytes, parse either returns a valid table or throws Error(kProtocolError).
TEST(TuneTableText, NeverCrashesOnGarbage) {
  const std::string valid = numbered_table(64 * kKiB).to_text();
  std::mt19937 rng(12345);
  auto byte = [&rng] { return static_cast<char>(rng() & 0xff); };
  int parsed = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    switch (iter % 4) {
      case 0:  // random bytes
        for (std::size_t n = rng() % 300; n > 0; --n) text += byte();
        break;
      case 1:  // a valid prefix followed by random bytes
        text = kGoodHead;
        for (std::size_t n = rng() % 200; n > 0; --n) text += byte();
        break;
      case 2:  // a valid table with a few bytes changed
        text = valid;
        for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k)
          text[rng() % text.size()] = byte();
        break;
      default:  // a valid table cut anywhere
        text = valid.substr(0, rng() % (valid.size() + 1));
    }
    try {
      TuneTable t = TuneTable::parse(text);
      ++parsed;
      EXPECT_EQ(TuneTable::parse(t.to_text()), t);
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kProtocolError) << e.what();
    }
  }
  EXPECT_GT(parsed, 0);  // cut tables and harmless changes still parse
}

TEST(TuneTableText, FusedBucketsRoundTripAndAreChecked) {
  const TuneKey key{"NVIDIA H200", 4, "one-gpu", 12040, 22703, "0.1.0"};
  const TuneTable t(key, {{512, Choice{Algo::kOneShot, 1, 512}, 2.5}},
                    {{8192, Choice{Algo::kLamport, 1, 512}, 3.25},
                     {16384, Choice{Algo::kLamportTwoShot, 2, 512}, 4.5},
                     {32768, Choice{}, 6.0}});
  const std::string text = t.to_text();
  EXPECT_NE(text.find("\nfused 8192 lamport 1 512 3.25\n"), std::string::npos) << text;
  EXPECT_EQ(TuneTable::parse(text), t);
  EXPECT_EQ(t.lookup_fused(100), (Choice{Algo::kLamport, 1, 512}));
  EXPECT_EQ(t.lookup_fused(9000), (Choice{Algo::kLamportTwoShot, 2, 512}));
  EXPECT_EQ(t.lookup_fused(32768), Choice{});
  EXPECT_EQ(t.lookup_fused(32769), std::nullopt);
  // A table without fused buckets has none; fused lines must fuse and increase.
  EXPECT_EQ(TuneTable(key, {}).lookup_fused(1), std::nullopt);
  const std::string head = "# tpcomm tune table v2\nkey " + key.to_text() + "\n";
  EXPECT_THROW((void)TuneTable::parse(head + "fused 512 one_shot 1 512 1\n"), Error);
  EXPECT_THROW(
      (void)TuneTable::parse(head + "fused 1024 lamport 1 512 1\nfused 512 lamport 1 512 1\n"),
      Error);
  EXPECT_THROW((void)TuneTable::parse(head + "fused 512 lamport 1\n"), Error);
  EXPECT_THROW(TuneTable(key, {}, {{512, Choice{Algo::kTwoShot, 1, 512}, 1.0}}), Error);
}

TEST(TuneTableText, ExchangeBucketsRoundTripAndAreChecked) {
  const TuneKey key{"NVIDIA H200", 8, "one-gpu", 12040, 22703, "0.1.0"};
  const TuneTable t(key, {{512, Choice{Algo::kOneShot, 1, 512}, 2.5}}, {},
                    {{4096, ExchangeChoice{ExchangeAlgo::kPull, 1, 256}, 9.5},
                     {1 << 20, ExchangeChoice{ExchangeAlgo::kPull, 16, 512}, 15.25},
                     {1 << 21, ExchangeChoice{}, 20.0}});
  const std::string text = t.to_text();
  EXPECT_NE(text.find("\nexchange 1048576 pull 16 512 15.25\n"), std::string::npos) << text;
  EXPECT_EQ(TuneTable::parse(text), t);
  EXPECT_EQ(t.lookup_exchange(1), (ExchangeChoice{ExchangeAlgo::kPull, 1, 256}));
  EXPECT_EQ(t.lookup_exchange(4097), (ExchangeChoice{ExchangeAlgo::kPull, 16, 512}));
  EXPECT_EQ(t.lookup_exchange(1 << 21), ExchangeChoice{});
  EXPECT_EQ(t.lookup_exchange((1 << 21) + 1), std::nullopt);
  EXPECT_EQ(TuneTable(key, {}).lookup_exchange(1), std::nullopt);
  const std::string head = "# tpcomm tune table v2\nkey " + key.to_text() + "\n";
  for (const char* bad : {"exchange 512 one_shot 1 512 1\n",  // an all-reduce algorithm
                          "exchange 512 pull 0 512 1\n",      // blocks out of range
                          "exchange 512 pull 1 100 1\n",      // threads not a block size
                          "exchange 512 none 1 512 1\n",      // none with a shape
                          "exchange 512 pull 1 512\n",        // a field missing
                          "exchange 512 pull 1 512 -1\n",     // a negative time
                          "exchange 1024 pull 1 512 1\nexchange 512 pull 1 512 1\n"})
    EXPECT_THROW((void)TuneTable::parse(head + bad), Error) << bad;
  EXPECT_THROW(TuneTable(key, {}, {}, {{512, ExchangeChoice{ExchangeAlgo::kPull, 65, 512}, 1.0}}),
               Error);
}

}  // namespace
}  // namespace tpcomm
