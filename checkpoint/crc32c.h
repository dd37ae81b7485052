// CRC-32C (Castagnoli, the iSCSI polynomial 0x1EDC6F41, reflected, init and
// final xor 0xFFFFFFFF): the checksum of every checkpoint file and piece
// (ShardFile.crc32c, SavedPiece.crc32c). Hardware-accelerated through ISA-L.
//
//   uint32_t c = Crc32c("123456789", 9);      // 0xE3069283
//   uint32_t d = Crc32c(tail, n, Crc32c(head, m));  // == Crc32c of head+tail
//
// Pure function; thread-safe.
#ifndef SHARDLINE_CHECKPOINT_CRC32C_H_
#define SHARDLINE_CHECKPOINT_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace shardline::checkpoint {

// The CRC-32C of `bytes` bytes at `data`, continuing from `crc`, the CRC-32C
// of the bytes before them (0 for none). `data` may be null when bytes == 0.
// Any size: buffers over 2 GiB are processed in chunks.
uint32_t Crc32c(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace shardline::checkpoint

#endif  // SHARDLINE_CHECKPOINT_CRC32C_H_
