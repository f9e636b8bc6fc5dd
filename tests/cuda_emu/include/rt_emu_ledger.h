/* The cost ledger's functions, exported with C linkage by the emulated CUDA runtime
 * (tests/cuda_emu/ledger.cpp, kernel_costs.cpp; docs/gpu.md "The cost ledger"). The types
 * are src/core/cost_ledger.h's. ringtrain reaches these through rt_cost_ledger_find()
 * (weak references), never by name: a real CUDA build has no ledger. Tests of the
 * emulation may call them directly. */
#ifndef RT_EMU_LEDGER_H
#define RT_EMU_LEDGER_H

#include "core/cost_ledger.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* mode 1 on, 2 count only (the emulation skips its arithmetic), 0 off; 1 keeps count
 * only when it is on. Returns the mode now. RINGTRAIN_EMU_LEDGER=1|count sets it at start. */
int rt_emu_ledger_enable(int mode);
/* forget everything recorded (totals, operations, the host synchronisations so far) */
void rt_emu_ledger_reset(void);
/* totals since the reset into out (out->size = sizeof *out first); -1 on a size mismatch */
int rt_emu_ledger_read(rt_cost_ledger *out);
/* up to cap recorded operations from index first; returns how many (the first 2^20 since
 * the reset are kept) */
size_t rt_emu_ledger_ops(rt_cost_op *out, size_t first, size_t cap);
/* the model that rt_cost_ledger.modelled_s sums (NULL: none) */
void rt_emu_ledger_set_model(const rt_cost_model *m);

/* the kernel cost table (kernel_costs.cpp): whether `name` has an entry; the entries'
 * names (*n of them) */
int rt_emu_kernel_cost_known(const char *name);
const char *const *rt_emu_kernel_cost_names(size_t *n);

#ifdef __cplusplus
}
#endif

#endif
