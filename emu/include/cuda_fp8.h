// cuda_fp8.h - 8-bit floats are not emulated. This header defines nothing,
// and in particular not __CUDA_FP8_TYPES_EXIST__, which programs test
// before they use __nv_fp8_e4m3 and __nv_fp8_e5m2.
#ifndef EMU_CUDA_FP8_H
#define EMU_CUDA_FP8_H

#include "cuda_fp16.h"

#endif
