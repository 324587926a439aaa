// SPDX-License-Identifier: Apache-2.0
// The TCP store's frames: fixed-size little-endian headers followed by the key and value bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace tpcomm::wire {

// NOTE [store wire format]
// A request is a 32-byte `RequestHeader`, then `key_len` key bytes, then `value_len` value
// bytes. A reply is a 24-byte `ReplyHeader`, then `value_len` bytes: the value of a GET, or the
// reason of an error reply as UTF-8 text. Every integer is little-endian with the width written
// in the struct; the structs are encoded field by field, never memcpy'd, so the byte order does
// not depend on the host.
//
// 1. The first request of every connection is HELLO with the token as its value (empty when the
//    client has none), even when the server has no token. Anything else first is rejected.
// 2. The server checks a header (`check_request`) before it reads or allocates the key and
//    value, so a frame announcing 2^40 bytes costs it 32 bytes of reading.
// 3. A rejected frame gets an error reply when the socket still accepts one; then the server
//    closes that connection (and only that one). `kTimeout`, `kInvalidArgument` and
//    `kOverLimit` replies are answers to a well-formed request: the connection stays open (for
//    `kOverLimit` the server reads the request to its end first, but for a value that awaits the
//    go-ahead (5), which is not sent).
// 4. One request is in flight per connection: the client waits for the reply before it sends
//    the next request, so replies need no request id.
// 5. A SET whose value is longer than `kMaxEagerValueBytes` (`awaits_go_ahead`) sends its header
//    and key, then waits. The server answers kGoAhead when it has room in flight for the whole
//    request (the room is then held for it): the client sends the value, and the reply follows.
//    Without room it answers kOverLimit with `kRetryLater` at once: the request is over, no value
//    follows, and the client may send the header again later. So a refused large SET costs a
//    header, not its value. A shorter value follows its header at once (no extra round trip).

/// "TPSQ" and "TPSR" read as little-endian 32-bit words.
inline constexpr std::uint32_t kRequestMagic = 0x51535054;
inline constexpr std::uint32_t kReplyMagic = 0x52535054;
/// 2: a rank's watch is claimed over its request connection first (CLAIM), and WATCH carries the
/// secret the claim returned (NOTE [rank watch]). 3: a large SET's value waits for the server's
/// go-ahead (NOTE [store wire format] 5).
inline constexpr std::uint16_t kVersion = 3;

/// Largest token a HELLO may carry, in bytes.
inline constexpr std::size_t kMaxTokenBytes = 1024;
/// Largest reason text an error reply carries, in bytes.
inline constexpr std::size_t kMaxReasonBytes = 1024;
/// Bytes of the secret a CLAIM returns and its WATCH presents.
inline constexpr std::size_t kWatchSecretBytes = 16;
/// Longest SET value sent with its header; a longer one waits for kGoAhead (NOTE [store wire
/// format] 5).
inline constexpr std::size_t kMaxEagerValueBytes = std::size_t{64} << 10;

/// What a request asks for. `arg` of the request header carries the 64-bit argument.
enum class Opcode : std::uint16_t {
  /// value = token. Must be the first request. Reply: kOk, result = protocol version.
  kHello = 1,
  /// key, value. Stores the value and wakes waiters. Reply: kOk.
  kSet = 2,
  /// key, arg = timeout in ms (>= 0). Reply: kOk with the value, or kTimeout.
  kGet = 3,
  /// key, arg = delta. The counter is 8 little-endian bytes, created as 0. Reply: kOk with
  /// result = new value, or kInvalidArgument when the key holds something else.
  kAdd = 4,
  /// key. Reply: kOk, result = 1 when the key exists, else 0.
  kCheck = 5,
  /// key, arg = timeout in ms (>= 0). One key per request: a client waiting for several keys
  /// sends one WAIT per key with the time left. Reply: kOk or kTimeout.
  kWait = 6,
  /// key. Reply: kOk, result = 1 when the key existed, else 0.
  kErase = 7,
  /// No key; arg = the job rank this connection watches (>= 0), value = the secret the rank's
  /// CLAIM returned; or arg = -1 and no value. The connection becomes that rank's watch
  /// connection (NOTE [rank watch]). Reply: kOk at once; after it the server sends only notices
  /// on this connection, and the client sends only one more WATCH, with arg = -1 and no value,
  /// when the rank leaves normally. kRefused, naming why (the connection then closes, losing
  /// nothing), for a rank not claimed, a wrong secret, a rank watched already or gone, a rank
  /// past the job's world size, or a store that takes no watches.
  kWatch = 8,
  /// No key, no value; arg = the job rank this client is (>= 0). The request connection stands
  /// for that rank from now on (NOTE [rank watch]). Reply: kOk with the rank's watch secret
  /// (`kWatchSecretBytes`, returned by no other request); kRefused, naming why, for a rank
  /// claimed already (by a connection still open) or gone, a rank past the job's world size, a
  /// store that takes no watches, or a connection that stands for a rank already. The
  /// connection stays open.
  kClaim = 9,
};

/// Outcome of a request.
enum class ReplyCode : std::uint16_t {
  kOk = 0,
  /// GET/WAIT: the key was not set within the request's timeout. Connection stays open.
  kTimeout = 1,
  /// A well-formed request the store cannot honour (ADD on a value that is not a counter, or one
  /// that would overflow the counter).
  /// Connection stays open.
  kInvalidArgument = 2,
  /// Malformed frame: bad magic, version, opcode, lengths, or a frame that stalled. Closes.
  kProtocolError = 3,
  /// Key or value longer than the server's limits. Closes.
  kTooLarge = 4,
  /// No HELLO first, or the wrong token. Closes.
  kUnauthenticated = 5,
  /// The server already serves `max_connections` connections. Closes.
  kBusy = 6,
  /// A well-formed request that would take the server over one of its limits (stored keys or
  /// bytes, bytes in flight); the reason names the limit. Nothing changed. Connection stays open.
  kOverLimit = 7,
  /// GET/WAIT: the key cannot come, because a rank of the job left (the reason says which).
  /// Connection stays open. On a watch connection: the notice that a rank left (result = the
  /// rank, value = the reason).
  kRankLost = 8,
  /// CLAIM or WATCH refused: the reason says why. After a CLAIM the connection stays open; after
  /// a WATCH it closes.
  kRefused = 9,
  /// A SET that awaits the go-ahead (NOTE [store wire format] 5) may send its value now; its
  /// reply follows the value. Carries no bytes.
  kGoAhead = 10,
};

struct RequestHeader {
  std::uint32_t magic = kRequestMagic;
  std::uint16_t version = kVersion;
  Opcode opcode = Opcode::kHello;
  std::uint32_t key_len = 0;
  /// Zero; a non-zero value is a protocol error (room for flags in a later version).
  std::uint32_t reserved = 0;
  std::uint64_t value_len = 0;
  /// Timeout in milliseconds (GET, WAIT) or the delta (ADD); zero otherwise.
  std::int64_t arg = 0;
};
static_assert(std::is_trivially_copyable_v<RequestHeader>);
static_assert(sizeof(RequestHeader) == 32);
static_assert(offsetof(RequestHeader, magic) == 0);
static_assert(offsetof(RequestHeader, version) == 4);
static_assert(offsetof(RequestHeader, opcode) == 6);
static_assert(offsetof(RequestHeader, key_len) == 8);
static_assert(offsetof(RequestHeader, reserved) == 12);
static_assert(offsetof(RequestHeader, value_len) == 16);
static_assert(offsetof(RequestHeader, arg) == 24);

struct ReplyHeader {
  std::uint32_t magic = kReplyMagic;
  ReplyCode code = ReplyCode::kOk;
  std::uint16_t reserved = 0;
  std::uint64_t value_len = 0;
  /// ADD: the new value; CHECK/ERASE: 1 or 0; HELLO: the server's protocol version; a notice on
  /// a watch connection: the rank that left (kRankLost), or -1 when the server stops (kOk);
  /// kOverLimit: `kRetryLater` when the limit was the bytes in flight, which other requests
  /// give back (the request was not applied: the client sends it again within its deadline).
  std::int64_t result = 0;
};

/// `ReplyHeader::result` of a kOverLimit reply that waiting may cure (`max_inflight_bytes`).
inline constexpr std::int64_t kRetryLater = 1;

/// True for a request whose value the client sends only after a kGoAhead reply: a SET of more
/// than `kMaxEagerValueBytes` (NOTE [store wire format] 5).
inline bool awaits_go_ahead(const RequestHeader& h) noexcept {
  return h.opcode == Opcode::kSet && h.value_len > kMaxEagerValueBytes;
}
static_assert(std::is_trivially_copyable_v<ReplyHeader>);
static_assert(sizeof(ReplyHeader) == 24);
static_assert(offsetof(ReplyHeader, magic) == 0);
static_assert(offsetof(ReplyHeader, code) == 4);
static_assert(offsetof(ReplyHeader, reserved) == 6);
static_assert(offsetof(ReplyHeader, value_len) == 8);
static_assert(offsetof(ReplyHeader, result) == 16);

inline constexpr std::size_t kRequestHeaderBytes = sizeof(RequestHeader);
inline constexpr std::size_t kReplyHeaderBytes = sizeof(ReplyHeader);

using RequestBytes = std::array<std::byte, kRequestHeaderBytes>;
using ReplyBytes = std::array<std::byte, kReplyHeaderBytes>;

RequestBytes encode(const RequestHeader& h) noexcept;
ReplyBytes encode(const ReplyHeader& h) noexcept;
RequestHeader decode_request(std::span<const std::byte, kRequestHeaderBytes> bytes) noexcept;
ReplyHeader decode_reply(std::span<const std::byte, kReplyHeaderBytes> bytes) noexcept;

/// The bytes of `text` as a frame carries them (a token, a reason).
inline std::span<const std::byte> as_bytes(std::string_view text) noexcept {
  return std::as_bytes(std::span(text.data(), text.size()));
}

/// Most bytes of a key that a message quotes (`quote_key`).
inline constexpr std::size_t kMaxQuotedKeyBytes = 256;
/// `key` as messages quote it: 'key', or its first `kMaxQuotedKeyBytes` bytes, "..." and its
/// length, so that a message naming a long key stays well within `kMaxReasonBytes`.
std::string quote_key(std::string_view key);

/// A counter value as stored: 8 little-endian bytes.
std::array<std::byte, 8> encode_counter(std::int64_t value) noexcept;
/// The counter held in `bytes`; nullopt unless it is exactly 8 bytes.
std::optional<std::int64_t> decode_counter(std::span<const std::byte> bytes) noexcept;

/// Limits a server enforces on requests.
struct Limits {
  std::size_t max_key_bytes = 4096;
  std::size_t max_value_bytes = std::size_t{64} << 20;
};

/// Why a frame was refused, and the reply code that says so.
struct Rejection {
  ReplyCode code = ReplyCode::kProtocolError;
  std::string reason;
};

/// Checks a request header before its payload is read: magic, version, opcode, reserved bits,
/// lengths against `limits` (and `kMaxTokenBytes` for HELLO), the lengths each opcode allows
/// (only SET, HELLO and WATCH carry a value; every opcode but HELLO, WATCH and CLAIM needs a
/// non-empty key), a rank in range for WATCH and CLAIM and a non-negative timeout. nullopt when the
/// header is acceptable.
std::optional<Rejection> check_request(const RequestHeader& h, const Limits& limits);

/// Checks a reply header before its payload is read: magic, a known code, and a length of at
/// most `max_value_bytes` (or `kMaxReasonBytes` for an error reply, 0 for kGoAhead). nullopt
/// when acceptable, else what is wrong.
std::optional<std::string> check_reply(const ReplyHeader& h, std::size_t max_value_bytes);

/// True for the opcodes above.
bool is_known(Opcode op) noexcept;
bool is_known(ReplyCode code) noexcept;
/// "HELLO", "SET", ...; "opcode N" for unknown ones.
std::string to_string(Opcode op);
/// "ok", "timeout", "protocol error", ...
std::string_view to_string(ReplyCode code) noexcept;

}  // namespace tpcomm::wire
