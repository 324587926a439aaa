// SPDX-License-Identifier: Apache-2.0
#include "bootstrap/wire.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace tpcomm::wire {
namespace {

TEST(Wire, RequestHeaderRoundTripsInLittleEndian) {
  RequestHeader h{
      .opcode = Opcode::kAdd, .key_len = 0x0102, .value_len = 0x0A0B0C0D0E0FULL, .arg = -2};
  RequestBytes b = encode(h);
  // magic "TPSQ", version 3, opcode 4, all little-endian at the documented offsets.
  EXPECT_EQ(std::memcmp(b.data(), "TPSQ", 4), 0);
  EXPECT_EQ(b[4], std::byte{3});
  EXPECT_EQ(b[5], std::byte{0});
  EXPECT_EQ(b[6], std::byte{4});
  EXPECT_EQ(b[8], std::byte{0x02});
  EXPECT_EQ(b[9], std::byte{0x01});
  EXPECT_EQ(b[16], std::byte{0x0F});
  EXPECT_EQ(b[21], std::byte{0x0A});
  EXPECT_EQ(b[24], std::byte{0xFE});
  EXPECT_EQ(b[31], std::byte{0xFF});
  RequestHeader d = decode_request(b);
  EXPECT_EQ(d.magic, kRequestMagic);
  EXPECT_EQ(d.version, kVersion);
  EXPECT_EQ(d.opcode, Opcode::kAdd);
  EXPECT_EQ(d.key_len, 0x0102u);
  EXPECT_EQ(d.value_len, 0x0A0B0C0D0E0FULL);
  EXPECT_EQ(d.arg, -2);
}

TEST(Wire, ReplyHeaderRoundTrips) {
  ReplyHeader h{.code = ReplyCode::kTimeout, .value_len = 7, .result = 1234567890123LL};
  ReplyBytes b = encode(h);
  EXPECT_EQ(std::memcmp(b.data(), "TPSR", 4), 0);
  ReplyHeader d = decode_reply(b);
  EXPECT_EQ(d.magic, kReplyMagic);
  EXPECT_EQ(d.code, ReplyCode::kTimeout);
  EXPECT_EQ(d.value_len, 7u);
  EXPECT_EQ(d.result, 1234567890123LL);
}

TEST(Wire, CounterIsEightLittleEndianBytes) {
  auto b = encode_counter(0x0102030405060708LL);
  EXPECT_EQ(b[0], std::byte{0x08});
  EXPECT_EQ(b[7], std::byte{0x01});
  EXPECT_EQ(decode_counter(b), 0x0102030405060708LL);
  EXPECT_EQ(decode_counter(encode_counter(-5)), -5);
  std::byte seven[7]{};
  EXPECT_FALSE(decode_counter(seven).has_value());
}

TEST(Wire, AcceptsWellFormedRequests) {
  Limits limits{.max_key_bytes = 16, .max_value_bytes = 100};
  EXPECT_FALSE(check_request({.opcode = Opcode::kHello, .value_len = 32}, limits));
  EXPECT_FALSE(check_request({.opcode = Opcode::kSet, .key_len = 16, .value_len = 100}, limits));
  EXPECT_FALSE(check_request({.opcode = Opcode::kGet, .key_len = 1, .arg = 0}, limits));
  EXPECT_FALSE(check_request({.opcode = Opcode::kAdd, .key_len = 1, .arg = -7}, limits));
  EXPECT_FALSE(check_request({.opcode = Opcode::kWait, .key_len = 3, .arg = 1000}, limits));
  EXPECT_FALSE(check_request({.opcode = Opcode::kCheck, .key_len = 3}, limits));
  EXPECT_FALSE(check_request({.opcode = Opcode::kErase, .key_len = 3}, limits));
}

TEST(Wire, RejectsMalformedHeadersWithReasons) {
  Limits limits{.max_key_bytes = 16, .max_value_bytes = 100};
  struct Case {
    RequestHeader h;
    ReplyCode code;
    const char* reason;
  };
  const Case cases[] = {
      {{.magic = 0xDEADBEEF, .opcode = Opcode::kSet, .key_len = 1},
       ReplyCode::kProtocolError,
       "bad magic 0xdeadbeef"},
      {{.version = 1, .opcode = Opcode::kSet, .key_len = 1},
       ReplyCode::kProtocolError,
       "version 1"},
      {{.opcode = static_cast<Opcode>(99), .key_len = 1},
       ReplyCode::kProtocolError,
       "unknown opcode 99"},
      {{.opcode = Opcode::kSet, .key_len = 1, .reserved = 1},
       ReplyCode::kProtocolError,
       "reserved"},
      {{.opcode = Opcode::kSet, .key_len = 17}, ReplyCode::kTooLarge, "key of 17 bytes"},
      {{.opcode = Opcode::kSet, .key_len = 1, .value_len = std::uint64_t{1} << 40},
       ReplyCode::kTooLarge,
       "value of 1099511627776 bytes"},
      {{.opcode = Opcode::kSet, .key_len = 0}, ReplyCode::kProtocolError, "empty key"},
      {{.opcode = Opcode::kGet, .key_len = 1, .value_len = 1},
       ReplyCode::kProtocolError,
       "carries no value"},
      {{.opcode = Opcode::kWait, .key_len = 1, .arg = -1},
       ReplyCode::kProtocolError,
       "negative timeout"},
      {{.opcode = Opcode::kHello, .key_len = 1}, ReplyCode::kProtocolError, "no key"},
      {{.opcode = Opcode::kHello, .value_len = kMaxTokenBytes + 1}, ReplyCode::kTooLarge, "token"},
  };
  for (const Case& c : cases) {
    auto r = check_request(c.h, limits);
    ASSERT_TRUE(r.has_value()) << c.reason;
    EXPECT_EQ(r->code, c.code) << r->reason;
    EXPECT_NE(r->reason.find(c.reason), std::string::npos) << r->reason;
  }
}

TEST(Wire, ChecksReplies) {
  EXPECT_FALSE(check_reply({.value_len = 10}, 10));
  EXPECT_TRUE(check_reply({.value_len = 11}, 10));
  EXPECT_TRUE(check_reply({.magic = 1}, 10));
  EXPECT_TRUE(check_reply({.code = static_cast<ReplyCode>(40)}, 10));
  // Error replies carry a reason of bounded length whatever the value limit.
  EXPECT_FALSE(check_reply({.code = ReplyCode::kTimeout, .value_len = kMaxReasonBytes}, 0));
  EXPECT_TRUE(
      check_reply({.code = ReplyCode::kProtocolError, .value_len = kMaxReasonBytes + 1}, 1 << 20));
  // "Over limit" and "rank lost" (and "refused") are error replies with a reason; the code after
  // them is unknown.
  EXPECT_FALSE(check_reply({.code = ReplyCode::kOverLimit, .value_len = kMaxReasonBytes}, 0));
  EXPECT_FALSE(check_reply({.code = ReplyCode::kRankLost, .value_len = kMaxReasonBytes}, 0));
  EXPECT_FALSE(check_reply({.code = ReplyCode::kRefused, .value_len = kMaxReasonBytes}, 0));
  // "Go ahead" carries no bytes; the code after it is unknown.
  EXPECT_FALSE(check_reply({.code = ReplyCode::kGoAhead}, 10));
  EXPECT_TRUE(check_reply({.code = ReplyCode::kGoAhead, .value_len = 1}, 10));
  EXPECT_TRUE(check_reply({.code = static_cast<ReplyCode>(11)}, 10));
}

TEST(Wire, OnlyALargeSetAwaitsTheGoAhead) {
  EXPECT_FALSE(awaits_go_ahead({.opcode = Opcode::kSet, .value_len = kMaxEagerValueBytes}));
  EXPECT_TRUE(awaits_go_ahead({.opcode = Opcode::kSet, .value_len = kMaxEagerValueBytes + 1}));
  EXPECT_FALSE(awaits_go_ahead({.opcode = Opcode::kHello, .value_len = kMaxEagerValueBytes + 1}));
  EXPECT_FALSE(awaits_go_ahead({.opcode = Opcode::kWatch, .value_len = kMaxEagerValueBytes + 1}));
}

TEST(Wire, AVersionMismatchNamesBothVersions) {
  auto r = check_request({.version = 2, .opcode = Opcode::kHello}, Limits{});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code, ReplyCode::kProtocolError);
  EXPECT_NE(r->reason.find("protocol version 2 is not supported: this store speaks version 3"),
            std::string::npos)
      << r->reason;
}

TEST(Wire, NamesOpcodes) {
  EXPECT_EQ(to_string(Opcode::kWait), "WAIT");
  EXPECT_EQ(to_string(static_cast<Opcode>(77)), "opcode 77");
  EXPECT_EQ(to_string(ReplyCode::kUnauthenticated), "unauthenticated");
  EXPECT_EQ(to_string(ReplyCode::kOverLimit), "over limit");
  EXPECT_EQ(to_string(ReplyCode::kRankLost), "rank lost");
  EXPECT_EQ(to_string(Opcode::kClaim), "CLAIM");
  EXPECT_EQ(to_string(ReplyCode::kRefused), "refused");
  EXPECT_EQ(to_string(ReplyCode::kGoAhead), "go ahead");
}

TEST(Wire, QuotesLongKeysShortened) {
  EXPECT_EQ(quote_key("abc"), "'abc'");
  const std::string exact(kMaxQuotedKeyBytes, 'k');
  EXPECT_EQ(quote_key(exact), "'" + exact + "'");
  EXPECT_EQ(quote_key(std::string(60000, 'k')), "'" + exact + "...' (60000 bytes)");
}

}  // namespace
}  // namespace tpcomm::wire
