#define RM_REDUCE_NS generic
#include "kernels/cpu/reduce_impl.inc"
