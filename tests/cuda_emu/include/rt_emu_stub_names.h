/* Host emulation (docs/cuda-emulation.md): functions the .cu files call that are
 * defined in CUDA-only .c files of the real backend. The emulation provides them under
 * an rt_emu_ name (stubs.c); this header renames the calls. Included by the generated
 * rt_emu_names.h. */
#ifndef RT_EMU_STUB_NAMES_H
#define RT_EMU_STUB_NAMES_H

/* src/model/cuda/backend_cuda.c: make the context's GPU current (the emulated device
 * is always current) */
#define rt_cuda_bind rt_emu_cuda_bind

#endif
