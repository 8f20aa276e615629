#include "train/data/test_files.h"

#include <zlib.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace ringmaster::train::data {

std::string IdxHeader(uint32_t magic, const std::vector<uint32_t>& dims) {
  std::string out;
  auto put = [&out](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  return out;
}

std::string WriteTestFile(const std::string& name, const std::string& contents,
                          Compression compression) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  CHECK(tmp != nullptr) << "TEST_TMPDIR is not set (run under bazel test)";
  const std::string path = absl::StrCat(tmp, "/", name);
  if (compression == Compression::kGzip) {
    gzFile file = gzopen(path.c_str(), "wb");
    CHECK(file != nullptr) << path;
    CHECK_EQ(gzwrite(file, contents.data(), static_cast<unsigned>(contents.size())),
             static_cast<int>(contents.size()))
        << path;
    CHECK_EQ(gzclose(file), Z_OK) << path;
  } else {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << contents;
    CHECK(out.good()) << path;
  }
  return path;
}

}  // namespace ringmaster::train::data
