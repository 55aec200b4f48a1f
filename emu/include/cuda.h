// cuda.h - the CUDA driver API's header, on the emulated GPU: only its
// version. The emulator has no driver API (cuMemAlloc, cuLaunchKernel,
// ...); programs that include this header for the runtime's sake compile.
#ifndef EMU_CUDA_H
#define EMU_CUDA_H

#include "cuda_runtime_api.h"

#define CUDA_VERSION CUDART_VERSION

#endif
