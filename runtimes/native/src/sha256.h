// sha256.h - FIPS 180-4 SHA-256 of a file, streamed (the manifest's checksum of every file the runner loads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace es {

class Sha256 {
 public:
  Sha256();
  void update(const uint8_t* data, size_t n);
  std::string hex_digest();  // finishes the hash; the object is spent afterwards

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t fill_ = 0;
  uint64_t bytes_ = 0;
};

std::string sha256_hex(const std::string& data);
// Throws std::runtime_error naming the path when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace es
