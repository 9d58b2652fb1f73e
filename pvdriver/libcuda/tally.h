/* The library's entry tally (tally.c). */
#include <stdint.h>
extern int vg_tally_on;
uint64_t vg_tally_now(void);
void vg_tally_add(uintptr_t fn, uint64_t start);
int vg_tally_slot(int i, uintptr_t *fn, uint64_t *calls, uint64_t *nanos);
int vg_tally_slots(void);
