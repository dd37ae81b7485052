#include "checkpoint/crc32c.h"

#include <isa-l/crc.h>

namespace shardline::checkpoint {

uint32_t Crc32c(const void* data, size_t bytes, uint32_t crc) {
  // crc32_iscsi keeps the register un-inverted: standard CRC-32C chaining is
  // ~crc32_iscsi(buf, len, ~previous). Its length is an int: chunk.
  constexpr size_t kChunk = size_t{1} << 30;
  uint32_t state = ~crc;
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  while (bytes > 0) {
    const size_t n = bytes < kChunk ? bytes : kChunk;
    state = crc32_iscsi(p, static_cast<int>(n), state);
    p += n;
    bytes -= n;
  }
  return ~state;
}

}  // namespace shardline::checkpoint
