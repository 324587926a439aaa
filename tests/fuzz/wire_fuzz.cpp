// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the store's frame decoder (NOTE [store wire format] in wire.hpp): any
// bytes decode without crashing, the checks accept or give a reason, and decoding is the
// inverse of encoding. Built with -DTPCOMM_FUZZ=ON and clang only; run as
//   build-fuzz/bin/tpcomm_wire_fuzz -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "bootstrap/wire.hpp"

namespace {

using namespace tpcomm::wire;

void require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < kRequestHeaderBytes) return 0;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  // The first 32 bytes as a request header, the first 24 as a reply header.
  const std::span<const std::byte, kRequestHeaderBytes> request_bytes(bytes, kRequestHeaderBytes);
  const RequestHeader request = decode_request(request_bytes);
  require(std::memcmp(encode(request).data(), bytes, kRequestHeaderBytes) == 0);
  const Limits limits{.max_key_bytes = 4096, .max_value_bytes = std::size_t{64} << 20};
  if (auto why = check_request(request, limits)) {
    require(!why->reason.empty() && why->code != ReplyCode::kOk);
  } else {
    // An accepted header is bounded before anything of the payload is read.
    require(request.key_len <= limits.max_key_bytes);
    require(request.value_len <= limits.max_value_bytes);
    require(is_known(request.opcode));
  }
  // Only a large SET waits for the go-ahead (NOTE [store wire format] 5).
  if (awaits_go_ahead(request)) {
    require(request.opcode == Opcode::kSet && request.value_len > kMaxEagerValueBytes);
  }
  (void)to_string(request.opcode);

  const std::span<const std::byte, kReplyHeaderBytes> reply_bytes(bytes, kReplyHeaderBytes);
  const ReplyHeader reply = decode_reply(reply_bytes);
  require(std::memcmp(encode(reply).data(), bytes, kReplyHeaderBytes) == 0);
  if (auto why = check_reply(reply, limits.max_value_bytes)) {
    require(!why->empty());
  } else {
    require(is_known(reply.code));
    require(reply.value_len <= limits.max_value_bytes);
    require(reply.code != ReplyCode::kGoAhead || reply.value_len == 0);
  }
  (void)to_string(reply.code);

  // The rest as a counter value.
  const std::span<const std::byte> rest(bytes + kRequestHeaderBytes, size - kRequestHeaderBytes);
  if (auto counter = decode_counter(rest)) {
    require(std::memcmp(encode_counter(*counter).data(), rest.data(), 8) == 0);
  } else {
    require(rest.size() != 8);
  }
  return 0;
}
