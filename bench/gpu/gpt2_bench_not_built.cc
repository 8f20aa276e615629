// Stands in for gpt2_bench.cc in builds without --config=cuda.
#include <cstdio>

int main() {
  std::fprintf(stderr,
               "gpt2_bench: the GPU GPT is not built: build with --config=cuda and run on a "
               "machine with a GPU\n");
  return 2;
}
