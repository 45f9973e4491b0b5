// CRC-32C (Castagnoli), the checksum of checkpoint files and of each tensor piece in them: the one
// ext4, iSCSI and Google's storage use, computed by the SSE 4.2 crc32 instruction where the CPU has it
// (several GB/s on one core) and by a table otherwise. Python: `crc32c.crc32c(data)` (pip install
// crc32c) gives the same numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace llm {

// The CRC-32C of `size` bytes at `data`, continuing from `crc` (the value of the bytes before them;
// 0 to start): crc32c(b, crc32c(a)) == crc32c(a + b).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// A CRC as checkpoints and data identities write it: 8 lower-case hex digits.
std::string crc_text(uint32_t crc);

// The CRC that `text` writes as crc_text does (8 hex digits, either case); false for anything else
// (a damaged or hand-edited index: the caller names the file and key).
bool parse_crc_text(const std::string& text, uint32_t* crc);

}  // namespace llm
