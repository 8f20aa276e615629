// Encodes whole files with the GPT-2 tokenizer and reports the throughput; checks that the
// tokens decode back to each file's bytes.
// Usage: gpt2_tokenizer_throughput [--ids_out=PATH] FILE...
//   --ids_out: writes each file's token ids, space-separated, one line a file.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "train/data/gpt2_tokenizer.h"

int main(int argc, char** argv) {
  using ::ringmaster::train::data::Gpt2Tokenizer;
  std::string ids_out;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--ids_out=")) {
      ids_out = arg.substr(std::string("--ids_out=").size());
    } else {
      files.push_back(arg);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: gpt2_tokenizer_throughput [--ids_out=PATH] FILE...\n");
    return 2;
  }
  const auto load_start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> tokenizer = Gpt2Tokenizer::Create();
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  std::ofstream ids_file;
  if (!ids_out.empty()) ids_file.open(ids_out);
  int64_t bytes = 0;
  int64_t tokens = 0;
  double encode_s = 0;
  for (const std::string& file : files) {
    absl::StatusOr<std::string> text = ringmaster::ReadFile(file);
    if (!text.ok()) {
      std::fprintf(stderr, "%s\n", text.status().ToString().c_str());
      return 1;
    }
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = (*tokenizer)->Encode(*text);
    encode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bytes += text->size();
    tokens += ids.size();
    if (ids_file.is_open()) ids_file << absl::StrJoin(ids, " ") << "\n";
    absl::StatusOr<std::string> decoded = (*tokenizer)->Decode(ids);
    if (!decoded.ok() || *decoded != *text) {
      std::fprintf(stderr, "%s: the tokens do not decode back to the file's bytes\n", file.c_str());
      return 1;
    }
  }
  std::printf(
      "loaded the tokenizer in %.2f s; encoded %lld bytes into %lld tokens in %.3f s: "
      "%.0f tokens/s, %.1f MB/s\n",
      load_s, static_cast<long long>(bytes), static_cast<long long>(tokens), encode_s,
      tokens / encode_s, bytes / encode_s / 1e6);
  return 0;
}
