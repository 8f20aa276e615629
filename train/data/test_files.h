// Test helpers: build IDX files byte by byte and write files, plain or gzip-compressed,
// under the test's temporary directory. testonly.
#ifndef RINGMASTER_TRAIN_DATA_TEST_FILES_H_
#define RINGMASTER_TRAIN_DATA_TEST_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace ringmaster::train::data {

enum class Compression { kNone, kGzip };

// The header: `magic` big-endian, then each dimension big-endian.
std::string IdxHeader(uint32_t magic, const std::vector<uint32_t>& dims);

// Writes `contents` to $TEST_TMPDIR/`name` (gzip-compressed with kGzip) and returns the
// path. CHECK-fails on an I/O error.
std::string WriteTestFile(const std::string& name, const std::string& contents,
                          Compression compression);

}  // namespace ringmaster::train::data

#endif  // RINGMASTER_TRAIN_DATA_TEST_FILES_H_
