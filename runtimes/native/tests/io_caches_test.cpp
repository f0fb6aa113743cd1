// io_caches_test.cpp - es::IoCaches keeps only the slots in use resident (io_caches.h ZeroPages), as
// tests/test_io_caches.py checks the Python caches: SmolLM2's shape at 2,048 slots (30 layers, 3 KV heads, head dim
// 64: 94 MB of K and V), the first bucket of every layer written, then the pages the OS holds counted (mincore).
// A std::vector<float>(n, 0.0f) per layer, as before, makes all 94 MB resident at construction.
//
//   io_caches_test      exit 0 and "io_caches: R of N pages resident" when at most the written ones are
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "io_caches.h"

namespace {

size_t resident_pages(float* data, size_t floats) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const auto addr = reinterpret_cast<uintptr_t>(data);
  const uintptr_t start = addr - addr % page;
  const size_t length = addr + floats * sizeof(float) - start;
  std::vector<unsigned char> vec((length + page - 1) / page);
  if (::mincore(reinterpret_cast<void*>(start), length, vec.data()) != 0) return size_t(-1);
  size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

}  // namespace

int main() {
  es::KVLayout layout;
  layout.max_context = 2048;
  for (int i = 0; i < 30; ++i) layout.caches.push_back({i, es::FULL, 3, 64, 2048, 0});
  es::IoCaches caches(layout, 64, 0);
  const size_t floats = size_t(3) * 2048 * 64, page = size_t(::sysconf(_SC_PAGESIZE));
  caches.prepare(0, 5);
  const int b = caches.bucket(es::FULL);
  for (size_t i = 0; i < 30; ++i)
    for (float* p : {caches.k(i), caches.v(i)})
      for (size_t j = 0; j < size_t(3) * b * 64; ++j) p[j] = 1.0f;  // the bound prefix [1, 3, b, 64]
  size_t resident = 0, zeros_ok = 1;
  for (size_t i = 0; i < 30; ++i)
    for (float* p : {caches.k(i), caches.v(i)}) {
      resident += resident_pages(p, floats);
      zeros_ok &= p[floats - 1] == 0.0f;
    }
  const size_t allowed = 60 * ((size_t(3) * b * 64 * sizeof(float)) / page + 2);  // written pages, edges rounded up
  const size_t total = 60 * (floats * sizeof(float) / page);
  std::printf("io_caches: %zu of %zu pages resident (bucket %d, at most %zu written)\n", resident, total, b, allowed);
  if (!zeros_ok) std::fprintf(stderr, "unwritten slots do not read as zeros\n");
  return resident <= allowed && zeros_ok ? 0 : 1;
}
