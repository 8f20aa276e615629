// Built with -mavx2 -mfma (see BUILD); used only when the processor has them.
#define RM_OPTIMIZER_NS avx2
#include "kernels/cpu/optimizer_impl.inc"
