/* The library the stand-in engine faults in: a write 8 bytes past a NULL base ("segfault at 8 ... error 6"). */
void gw_register_arena(volatile char *base) { *(volatile int *)(base + 8) = 1; }
