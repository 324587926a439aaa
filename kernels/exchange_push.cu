// SPDX-License-Identifier: Apache-2.0
// The exchange (push): every rank writes what each peer takes from it straight into its slot of
// that peer's Lamport buffer, in lines that carry their own arrival flags, and takes what it
// receives from its own buffer as it arrives: no staging copy and no barrier. The exchange's form
// for small messages; all-gather, all-to-all and the LM-head exchange share it as they share the
// pull form (kernels/exchange.cu).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/check.hpp"
#include "kernels/common/copy.cuh"
#include "kernels/common/dispatch.cuh"
#include "kernels/common/lamport.cuh"
#include "kernels/common/lines.hpp"
#include "kernels/kernels.hpp"

namespace tpcomm::kernels {

// NOTE [exchange push]
// The Lamport all-reduce's data is its own flag (NOTE [lamport] in ipc/layout.hpp), which works
// for 16-bit floats only: an exchange moves any bits. So the push form sends lines of 16 bytes,
// two 4-byte words of data each beside a flag word, {word 2i, flag, word 2i + 1, flag} (the
// layout of NCCL's LL protocol). The flag is the call's Lamport header (`lamport_header`: 30 bits
// of the fingerprint's hash, neither 16-bit half the empty mark): a line has arrived once neither
// flag word is the empty pattern, and belongs to this call when both equal the header; any other
// value is a peer in another call (kMismatch). A 16-byte store may reach the peer as two 8-byte
// halves, each with its flag: both must have arrived.
//
// The buffers, their rotation and their refill are the Lamport all-reduce's, numbered by the same
// `lamport_seq`, so the two interleave on a stream: rank s writes its region for rank d into slot
// s of d's buffer of the operation, flattened row-major into 4-byte words (every rank agrees on
// the lines whatever its own pointers' alignment), and d records the most bytes any slot
// received, which its next Lamport operation refills with empty marks. The lines' flags are the
// exchange's fingerprint check (NOTE [fingerprints] in kernels/common/sync.cuh), and a rank that
// takes a peer's lines has heard from it in this operation, as the rotation of the buffers needs
// (NOTE [lamport]): so it pushes a Lamport header only to the peers that take no lines from it,
// and block 0 waits for the headers of the peers it takes none from, after its lines. A Lamport
// all-reduce's packs are not lines with this call's flag, so an exchange on one rank and a
// Lamport all-reduce on another fail with kMismatch on the exchange's rank at once, and on the
// all-reduce's at the deadline (it waits for a header the exchange did not push), where its
// host names both calls.
//
// Regions whose rows are not whole 4-byte words, or that a slot cannot hold at twice their bytes,
// take the pull form, chosen alike on every rank from the shapes (`ExchangePlan::push_slot_bytes`).
// Each rank reads its input and writes its output in the widest access `A` (8, 4, 2 or 1 bytes)
// that its own addresses allow (the layout of lines: kernels/common/lines.hpp, which the cpu
// tier runs on the host too). The lines of every region, its own last (which it copies into its
// own output), make one list spread over every thread of the grid (`RegionList`), so that at
// small sizes each thread has a line or two. A thread issues the loads of up to four of its lines
// (two with narrower accesses), whichever regions they are in, before it stores or waits for
// any: where a thread has four lines or fewer, its push is one round trip to memory and its take
// another. (Taken a region at a time, with the own region copied after the pushes, a thread's
// lines cost a round trip each: up to 2R - 1 at small sizes.)

namespace {

__device__ __forceinline__ bool line_arrived(uint4 x) { return x.y != kEmpty2 && x.w != kEmpty2; }

/// Lines a thread loads before it waits for any: narrower accesses work out two addresses a line,
/// and fewer lines in flight keep them in registers (four spilled at 4 ranks and more).
template <int A>
inline constexpr int kBatch = A == 8 ? 4 : 2;

/// Writes this rank's region for every peer into its slot of that peer's buffer, and its own
/// region into its output: one list (entry k the region for rank + 1 + k, the last its own), so
/// that a thread's loads travel together whichever regions its lines are in, and the lines that
/// peers wait for come first in it.
template <int R, int A>
__device__ __forceinline__ void push_lines(const ExchangeParams& p, const LamportFrame& f,
                                           std::uint32_t flag, std::uint64_t first,
                                           std::uint64_t stride) {
  const char* in = static_cast<const char*>(p.input);
  char* out = static_cast<char*>(p.output);
  const std::int64_t own_slot = static_cast<std::int64_t>(p.rank) * p.layout.lamport_slot_bytes;
  auto peer = [&](int k) { return p.rank + 1 + k < R ? p.rank + 1 + k : p.rank + 1 + k - R; };
  auto region = [&](int k) -> const CopyRegion& {
    return k == R - 1 ? p.from[p.rank] : p.to[peer(k)];
  };
  const RegionList<R> list([&](int k) { return Lines(region(k)).count; });
  for (std::uint64_t g0 = first; g0 < list.total(); g0 += kBatch<A> * stride) {
    Line v[kBatch<A>];
    int at[kBatch<A>];
#pragma unroll
    for (int u = 0; u < kBatch<A>; ++u) {
      const std::uint64_t g = g0 + u * stride;
      if (g >= list.total()) break;
      at[u] = list.region(static_cast<std::uint32_t>(g));
      const CopyRegion& c = region(at[u]);
      v[u] = load_line<A>(in, c, Lines(c), list.index(static_cast<std::uint32_t>(g), at[u]));
    }
#pragma unroll
    for (int u = 0; u < kBatch<A>; ++u) {
      const std::uint64_t g = g0 + u * stride;
      if (g >= list.total()) break;
      const int k = at[u];
      const CopyRegion& c = region(k);
      const std::uint32_t i = list.index(static_cast<std::uint32_t>(g), k);
      if (k == R - 1)
        store_line<A>(out, c, Lines(c), i, v[u]);
      else
        st_volatile(lamport_buffer(p, peer(k), f.buffer) + own_slot + std::int64_t{i} * 16,
                    make_uint4(v[u].lo, flag, v[u].hi, flag));
    }
  }
}

/// Whether this thread checks the header of rank threadIdx.x: block 0's, for the peers whose
/// lines it takes none of.
template <int R>
__device__ __forceinline__ bool checks_header(const ExchangeParams& p) {
  const int s = static_cast<int>(threadIdx.x);
  return blockIdx.x == 0 && s < R && s != p.rank && Lines(p.from[s]).count == 0;
}

/// Takes every peer's region from this rank's buffer into the output as its lines arrive: one
/// list (entry k the region from rank - k; k = 0, its own, has none here). False when a wait
/// gave up or a line carried another call's flag (reported).
template <int R, int A>
__device__ __forceinline__ bool take_lines(const ExchangeParams& p, const LamportFrame& f,
                                           std::uint32_t flag, std::uint64_t first,
                                           std::uint64_t stride) {
  char* out = static_cast<char*>(p.output);
  const char* mine = lamport_buffer(p, p.rank, f.buffer);
  auto source = [&](int k) { return p.rank >= k ? p.rank - k : p.rank - k + R; };
  const RegionList<R> list([&](int k) { return k == 0 ? 0u : Lines(p.from[source(k)]).count; });
  for (std::uint64_t g0 = first; g0 < list.total(); g0 += kBatch<A> * stride) {
    uint4 x[kBatch<A>];
    int at[kBatch<A>];
#pragma unroll
    for (int u = 0; u < kBatch<A>; ++u) {
      const std::uint64_t g = g0 + u * stride;
      if (g >= list.total()) break;
      at[u] = list.region(static_cast<std::uint32_t>(g));
      const std::uint32_t i = list.index(static_cast<std::uint32_t>(g), at[u]);
      x[u] = ld_volatile(mine + source(at[u]) * p.layout.lamport_slot_bytes + std::int64_t{i} * 16);
    }
#pragma unroll
    for (int u = 0; u < kBatch<A>; ++u) {
      const std::uint64_t g = g0 + u * stride;
      if (g >= list.total()) break;
      const int s = source(at[u]);
      const std::uint32_t i = list.index(static_cast<std::uint32_t>(g), at[u]);
      const char* line = mine + s * p.layout.lamport_slot_bytes + std::int64_t{i} * 16;
      uint4 v = x[u];
      if (!line_arrived(v) && !wait_until<ErrorWord::kLamportCount>(
                                  [&] {
                                    v = ld_volatile(line);
                                    return line_arrived(v);
                                  },
                                  f.wait, s))
        return false;
      if (v.y != flag || v.w != flag) {
        report<ErrorWord::kLamportCount>(f.wait, ErrorWord::kMismatch, s);
        return false;
      }
      const CopyRegion& c = p.from[s];
      store_line<A>(out, c, Lines(c), i, Line{v.x, v.z});
    }
  }
  return true;
}

template <int R, int A>
__global__ void __launch_bounds__(1024, 1) exchange_push_kernel(ExchangeParams p) {
  begin_launch();
  if (p.world_size == 0) return;  // a warm-up launch (NOTE [first launch])
  const std::uint64_t first = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const LamportFrame f = lamport_frame(p);
  const std::uint32_t flag = lamport_header(p.fingerprint);
  // A failed rank gives up at once (NOTE [bounded waits]): it pushes nothing and waits for nothing.
  if (!f.failed) {
    // The header, to the peers that take no lines from this rank (NOTE [exchange push]).
    lamport_push_header<R>(p, f, [&](int d) { return d != p.rank && Lines(p.to[d]).count == 0; });
    push_lines<R, A>(p, f, flag, first, stride);
    lamport_refill<R>(p, f);
  }
  bool ok = !f.failed && take_lines<R, A>(p, f, flag, first, stride);
  ok = ok && lamport_check_header<R>(f, LamportHeader<R>(p, f, checks_header<R>(p)));
  if (ok && p.early_launch) allow_next_launch();  // NOTE [programmatic launch]
  if (!__syncthreads_and(ok)) return poison_exchange<R, A>(p);
  SignalPad* self = p.pads[p.rank];
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    std::int64_t used = 0;  // the most bytes a peer wrote into a slot here: the next refill's
    for (int s = 0; s < R; ++s)
      if (s != p.rank)
        if (const std::int64_t b = exchange_push_slot_bytes(p.from[s].rows * p.from[s].row_bytes);
            b > used)
          used = b;
    self->lamport_dirty[f.buffer] = static_cast<std::uint32_t>(used);
  }
  end_launch(self->lamport_seq, f.seq);
}

/// The push kernel for `world_size` ranks and accesses of `access` bytes (8, 4, 2, 1).
const void* push_function(int world_size, int access) noexcept {
  const void* out = nullptr;
  (void)dispatch_world_size(world_size, [&]<int R>() {
    switch (access) {
      case 8:
        out = reinterpret_cast<const void*>(&exchange_push_kernel<R, 8>);
        break;
      case 4:
        out = reinterpret_cast<const void*>(&exchange_push_kernel<R, 4>);
        break;
      case 2:
        out = reinterpret_cast<const void*>(&exchange_push_kernel<R, 2>);
        break;
      case 1:
        out = reinterpret_cast<const void*>(&exchange_push_kernel<R, 1>);
        break;
      default:
        break;
    }
    return Status::kOk;
  });
  return out;
}

/// True when every region of `regions` with bytes is whole 4-byte words a row and fits a slot
/// of `slot_bytes` in the push form (its own, `skip`, travels no slot).
bool pushable(const CopyRegion* regions, int world, int skip, std::int64_t slot_bytes) {
  for (int r = 0; r < world; ++r) {
    const CopyRegion& c = regions[r];
    if (c.rows <= 0 || c.row_bytes <= 0) continue;
    if (c.row_bytes % 4 != 0) return false;
    if (r != skip && exchange_push_slot_bytes(c.rows * c.row_bytes) > slot_bytes) return false;
  }
  return true;
}

}  // namespace

Status launch_exchange_push(const ExchangeParams& params, LaunchShape shape, bool programmatic,
                            Stream stream) noexcept {
  const int world = params.world_size;
  if (world < 2 || world > kMaxRanks || params.rank < 0 || params.rank >= world ||
      shape.blocks < 1 || shape.blocks > kMaxBlocks || shape.threads < 32 || shape.threads > 1024 ||
      shape.threads % 32 != 0 || shape.threads < world)
    return Status::kInvalidArgument;
  const std::int64_t slot = params.layout.lamport_slot_bytes;
  if (!pushable(params.from, world, params.rank, slot) ||
      !pushable(params.to, world, params.rank, slot))
    return Status::kInvalidArgument;
  const int access = std::min({8, access_for(params.from, world, params.output, nullptr),
                               access_for(params.to, world, params.input, nullptr)});
  if (access == 0) return Status::kInvalidArgument;
  return launch_with(push_function(world, access), params, shape, programmatic, stream);
}

Status warm_up_exchange_push(int world_size, Stream stream) noexcept {
  ExchangeParams empty{};  // world size 0: the kernel returns at once
  for (int access : {8, 4, 2, 1}) {
    const void* function = push_function(world_size, access);
    if (function == nullptr) return Status::kInvalidArgument;
    TPCOMM_TRY(launch_with(function, empty, {1, 32}, false, stream));
  }
  return Status::kOk;
}

int exchange_push_max_blocks_per_sm(int world_size, int threads) noexcept {
  int most = 0;
  for (int access : {8, 4, 2, 1}) {
    const void* function = push_function(world_size, access);
    int blocks = 0;
    if (function == nullptr ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, function, threads, 0) != cudaSuccess)
      return 0;
    most = most == 0 ? blocks : std::min(most, blocks);
  }
  return most;
}

}  // namespace tpcomm::kernels
