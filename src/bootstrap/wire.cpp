// SPDX-License-Identifier: Apache-2.0
// Encoding and validation of the store's frames (NOTE [store wire format] in wire.hpp).
#include "bootstrap/wire.hpp"

#include <cstdio>
#include <limits>

#include "core/check.hpp"

namespace tpcomm::wire {
namespace {

template <class T>
void store_le(std::byte* out, T value) noexcept {
  using U = std::make_unsigned_t<T>;
  auto u = static_cast<U>(value);
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out[i] = static_cast<std::byte>(u & 0xFFu);
    u = static_cast<U>(u >> 8);
  }
}

template <class T>
T load_le(const std::byte* in) noexcept {
  using U = std::make_unsigned_t<T>;
  U u = 0;
  for (std::size_t i = sizeof(T); i-- > 0;)
    u = static_cast<U>((u << 8) | std::to_integer<U>(in[i]));
  return static_cast<T>(u);
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

Rejection reject(ReplyCode code, std::string reason) { return Rejection{code, std::move(reason)}; }

}  // namespace

RequestBytes encode(const RequestHeader& h) noexcept {
  RequestBytes b{};
  store_le(b.data() + offsetof(RequestHeader, magic), h.magic);
  store_le(b.data() + offsetof(RequestHeader, version), h.version);
  store_le(b.data() + offsetof(RequestHeader, opcode), static_cast<std::uint16_t>(h.opcode));
  store_le(b.data() + offsetof(RequestHeader, key_len), h.key_len);
  store_le(b.data() + offsetof(RequestHeader, reserved), h.reserved);
  store_le(b.data() + offsetof(RequestHeader, value_len), h.value_len);
  store_le(b.data() + offsetof(RequestHeader, arg), h.arg);
  return b;
}

ReplyBytes encode(const ReplyHeader& h) noexcept {
  ReplyBytes b{};
  store_le(b.data() + offsetof(ReplyHeader, magic), h.magic);
  store_le(b.data() + offsetof(ReplyHeader, code), static_cast<std::uint16_t>(h.code));
  store_le(b.data() + offsetof(ReplyHeader, reserved), h.reserved);
  store_le(b.data() + offsetof(ReplyHeader, value_len), h.value_len);
  store_le(b.data() + offsetof(ReplyHeader, result), h.result);
  return b;
}

RequestHeader decode_request(std::span<const std::byte, kRequestHeaderBytes> b) noexcept {
  RequestHeader h;
  h.magic = load_le<std::uint32_t>(b.data() + offsetof(RequestHeader, magic));
  h.version = load_le<std::uint16_t>(b.data() + offsetof(RequestHeader, version));
  h.opcode =
      static_cast<Opcode>(load_le<std::uint16_t>(b.data() + offsetof(RequestHeader, opcode)));
  h.key_len = load_le<std::uint32_t>(b.data() + offsetof(RequestHeader, key_len));
  h.reserved = load_le<std::uint32_t>(b.data() + offsetof(RequestHeader, reserved));
  h.value_len = load_le<std::uint64_t>(b.data() + offsetof(RequestHeader, value_len));
  h.arg = load_le<std::int64_t>(b.data() + offsetof(RequestHeader, arg));
  return h;
}

ReplyHeader decode_reply(std::span<const std::byte, kReplyHeaderBytes> b) noexcept {
  ReplyHeader h;
  h.magic = load_le<std::uint32_t>(b.data() + offsetof(ReplyHeader, magic));
  h.code = static_cast<ReplyCode>(load_le<std::uint16_t>(b.data() + offsetof(ReplyHeader, code)));
  h.reserved = load_le<std::uint16_t>(b.data() + offsetof(ReplyHeader, reserved));
  h.value_len = load_le<std::uint64_t>(b.data() + offsetof(ReplyHeader, value_len));
  h.result = load_le<std::int64_t>(b.data() + offsetof(ReplyHeader, result));
  return h;
}

std::array<std::byte, 8> encode_counter(std::int64_t value) noexcept {
  std::array<std::byte, 8> b{};
  store_le(b.data(), value);
  return b;
}

std::optional<std::int64_t> decode_counter(std::span<const std::byte> bytes) noexcept {
  if (bytes.size() != 8) return std::nullopt;
  return load_le<std::int64_t>(bytes.data());
}

std::string quote_key(std::string_view key) {
  if (key.size() <= kMaxQuotedKeyBytes) return detail::concat("'", key, "'");
  return detail::concat("'", key.substr(0, kMaxQuotedKeyBytes), "...' (", key.size(), " bytes)");
}

bool is_known(Opcode op) noexcept {
  switch (op) {
    case Opcode::kHello:
    case Opcode::kSet:
    case Opcode::kGet:
    case Opcode::kAdd:
    case Opcode::kCheck:
    case Opcode::kWait:
    case Opcode::kErase:
    case Opcode::kWatch:
    case Opcode::kClaim:
      return true;
  }
  return false;
}

bool is_known(ReplyCode code) noexcept {
  switch (code) {
    case ReplyCode::kOk:
    case ReplyCode::kTimeout:
    case ReplyCode::kInvalidArgument:
    case ReplyCode::kProtocolError:
    case ReplyCode::kTooLarge:
    case ReplyCode::kUnauthenticated:
    case ReplyCode::kBusy:
    case ReplyCode::kOverLimit:
    case ReplyCode::kRankLost:
    case ReplyCode::kRefused:
    case ReplyCode::kGoAhead:
      return true;
  }
  return false;
}

std::string to_string(Opcode op) {
  switch (op) {
    case Opcode::kHello:
      return "HELLO";
    case Opcode::kSet:
      return "SET";
    case Opcode::kGet:
      return "GET";
    case Opcode::kAdd:
      return "ADD";
    case Opcode::kCheck:
      return "CHECK";
    case Opcode::kWait:
      return "WAIT";
    case Opcode::kErase:
      return "ERASE";
    case Opcode::kWatch:
      return "WATCH";
    case Opcode::kClaim:
      return "CLAIM";
  }
  return detail::concat("opcode ", static_cast<unsigned>(op));
}

std::string_view to_string(ReplyCode code) noexcept {
  switch (code) {
    case ReplyCode::kOk:
      return "ok";
    case ReplyCode::kTimeout:
      return "timeout";
    case ReplyCode::kInvalidArgument:
      return "invalid argument";
    case ReplyCode::kProtocolError:
      return "protocol error";
    case ReplyCode::kTooLarge:
      return "too large";
    case ReplyCode::kUnauthenticated:
      return "unauthenticated";
    case ReplyCode::kBusy:
      return "busy";
    case ReplyCode::kOverLimit:
      return "over limit";
    case ReplyCode::kRankLost:
      return "rank lost";
    case ReplyCode::kRefused:
      return "refused";
    case ReplyCode::kGoAhead:
      return "go ahead";
  }
  return "unknown reply code";
}

std::optional<Rejection> check_request(const RequestHeader& h, const Limits& limits) {
  using detail::concat;
  if (h.magic != kRequestMagic) {
    return reject(ReplyCode::kProtocolError,
                  concat("bad magic ", hex32(h.magic), " (expected ", hex32(kRequestMagic),
                         "): not a tpcomm store client"));
  }
  if (h.version != kVersion) {
    return reject(
        ReplyCode::kProtocolError,
        concat("protocol version ", h.version, " is not supported: this store speaks version ",
               kVersion, " (the client and the store come from different tpcomm releases)"));
  }
  if (!is_known(h.opcode))
    return reject(ReplyCode::kProtocolError, concat("unknown ", to_string(h.opcode)));
  if (h.reserved != 0) {
    return reject(ReplyCode::kProtocolError, concat("reserved field is ", h.reserved, ", not 0"));
  }
  const std::string op = to_string(h.opcode);
  if (h.opcode == Opcode::kHello) {
    if (h.key_len != 0) return reject(ReplyCode::kProtocolError, "HELLO carries no key");
    if (h.value_len > kMaxTokenBytes) {
      return reject(ReplyCode::kTooLarge,
                    concat("token of ", h.value_len, " bytes is longer than ", kMaxTokenBytes));
    }
    return std::nullopt;
  }
  if (h.opcode == Opcode::kWatch || h.opcode == Opcode::kClaim) {
    if (h.arg < (h.opcode == Opcode::kWatch ? -1 : 0) ||
        h.arg > std::numeric_limits<std::int32_t>::max())
      return reject(ReplyCode::kProtocolError, concat(op, " of rank ", h.arg, " is out of range"));
    const std::size_t value = h.opcode == Opcode::kWatch && h.arg >= 0 ? kWatchSecretBytes : 0;
    if (h.key_len != 0 || h.value_len != value) {
      return reject(ReplyCode::kProtocolError,
                    concat(op, " of rank ", h.arg, " carries no key and ", value,
                           " value bytes, got ", h.key_len, " and ", h.value_len));
    }
    return std::nullopt;
  }
  if (h.key_len == 0) return reject(ReplyCode::kProtocolError, concat(op, " with an empty key"));
  if (h.key_len > limits.max_key_bytes) {
    return reject(ReplyCode::kTooLarge, concat(op, " key of ", h.key_len, " bytes is longer than ",
                                               limits.max_key_bytes));
  }
  if (h.opcode == Opcode::kSet) {
    if (h.value_len > limits.max_value_bytes) {
      return reject(ReplyCode::kTooLarge, concat("SET value of ", h.value_len,
                                                 " bytes is longer than ", limits.max_value_bytes));
    }
  } else if (h.value_len != 0) {
    return reject(ReplyCode::kProtocolError,
                  concat(op, " carries no value, got ", h.value_len, " bytes"));
  }
  if ((h.opcode == Opcode::kGet || h.opcode == Opcode::kWait) && h.arg < 0) {
    return reject(ReplyCode::kProtocolError, concat(op, " with a negative timeout ", h.arg));
  }
  return std::nullopt;
}

std::optional<std::string> check_reply(const ReplyHeader& h, std::size_t max_value_bytes) {
  using detail::concat;
  if (h.magic != kReplyMagic) {
    return concat("bad reply magic ", hex32(h.magic), " (expected ", hex32(kReplyMagic),
                  "): not a tpcomm store server");
  }
  if (!is_known(h.code)) return concat("unknown reply code ", static_cast<unsigned>(h.code));
  const std::size_t limit = h.code == ReplyCode::kOk        ? max_value_bytes
                            : h.code == ReplyCode::kGoAhead ? 0
                                                            : kMaxReasonBytes;
  if (h.value_len > limit) {
    return concat("reply of ", h.value_len, " bytes is longer than the limit of ", limit);
  }
  return std::nullopt;
}

}  // namespace tpcomm::wire
