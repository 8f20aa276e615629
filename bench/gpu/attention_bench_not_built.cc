// Stands in for attention_bench.cc in builds without --config=cuda.
#include <cstdio>

int main() {
  std::fprintf(stderr,
               "attention_bench: CUDA kernels not built: build with --config=cuda and run on a "
               "machine with a GPU\n");
  return 2;
}
