// Built with -mavx2 -mfma -mf16c (see BUILD); used only when the processor has them.
#define RM_REDUCE_NS avx2
#include "kernels/cpu/reduce_impl.inc"
