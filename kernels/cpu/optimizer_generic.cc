#define RM_OPTIMIZER_NS generic
#include "kernels/cpu/optimizer_impl.inc"
