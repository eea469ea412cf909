/* gpushim — public C API of libgpushim.so.
 *
 * A program finds out whether it runs under gpushim, and what its budgets are, by looking the
 * functions up at run time (so it also runs without the shim):
 *
 *     typedef int (*usage_fn)(int, uint64_t *, uint64_t *, uint64_t *);
 *     usage_fn usage = (usage_fn)dlsym(RTLD_DEFAULT, "gpushim_memory_usage");
 *     uint64_t used, peak, limit;
 *     if (usage && usage(0, &used, &peak, &limit) == 0) { ... }
 */
#ifndef GPUSHIM_H
#define GPUSHIM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version, e.g. "0.1.0" (a static string). */
const char *gpushim_version(void);

/* Memory of device `ordinal` (an ordinal of the program's view): bytes in use, the highest
 * amount in use so far, and the effective limit (min(configured limit, physical memory)).
 * Any out-pointer may be NULL. Returns 0; -1 when the shim is not active (GPUSHIM_DISABLE,
 * a configuration error, no driver) or `ordinal` is not a device it accounts for. Calling it
 * initialises the shim (and opens the driver) if the program has not used CUDA yet. */
int gpushim_memory_usage(int ordinal, uint64_t *in_use, uint64_t *peak, uint64_t *limit);

/* Checks that the library's own failure handling works in this process: raises an internal
 * failure and catches it, as every entry point catches one. Returns 0. (A library whose
 * unwinder could not find its own unwind tables would end the process instead: a diagnostic
 * for unusual loaders and sandboxes.) Does not initialise the shim. */
int gpushim_self_check(void);

#ifdef __cplusplus
}
#endif

#endif /* GPUSHIM_H */
