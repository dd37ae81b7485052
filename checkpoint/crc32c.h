// CRC-32C (Castagnoli, the iSCSI polynomial 0x1EDC6F41, reflected, init and
// final xor 0xFFFFFFFF): the checksum of every checkpoint file and piece
// (ShardFile.crc32c, SavedPiece.crc32c). Hardware-accelerated through ISA-L.
//
//   uint32_t c = Crc32c("123456789", 9);      // 0xE3069283
//   uint32_t d = Crc32c(tail, n, Crc32c(head, m));  // == Crc32c of head+tail
//   uint32_t e = Crc32cCombine(Crc32c(head, m), Crc32c(tail, n), n);  // == d
//
// Pure functions; thread-safe.
#ifndef SHARDLINE_CHECKPOINT_CRC32C_H_
#define SHARDLINE_CHECKPOINT_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace shardline::checkpoint {

// The CRC-32C of `bytes` bytes at `data`, continuing from `crc`, the CRC-32C
// of the bytes before them (0 for none). `data` may be null when bytes == 0.
// Any size: buffers over 2 GiB are processed in chunks.
uint32_t Crc32c(const void* data, size_t bytes, uint32_t crc = 0);

// The CRC-32C of the concatenation A+B from crc_a = Crc32c(A),
// crc_b = Crc32c(B) and b_bytes = the length of B in bytes, without the
// data: pieces checksummed separately (possibly on different threads) give
// their whole's checksum. Cost: O(log b_bytes) carry-less 32-bit products,
// under a microsecond. Crc32cCombine(0, c, n) == c (A empty) and
// Crc32cCombine(c, 0, 0) == c (B empty).
//
// Why it works (the argument of zlib's crc32_combine): with init and final
// xor ~0, Crc32c(M) = R(M, ~0) ^ ~0, where R(M, s), the register after M
// from state s, is linear: R(M, s) = s * x^(8|M|) + R(M, 0) over GF(2)[x]
// mod P. Then Crc32c(A+B) = R(B, Crc32c(A) ^ ~0) ^ ~0
//   = Crc32c(A) * x^(8|B|) + [~0 * x^(8|B|) + R(B, 0) + ~0]
//   = Crc32c(A) * x^(8|B|) + Crc32c(B)   (mod P),
// so one product by x^(8 b_bytes) mod P, which is the product of the
// precomputed x^(8 * 2^k) mod P for the set bits k of b_bytes.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t b_bytes);

}  // namespace shardline::checkpoint

#endif  // SHARDLINE_CHECKPOINT_CRC32C_H_
