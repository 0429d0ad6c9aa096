/* libtorchlike.so: laid out like torch's libtorch_python.so: it calls cudaHostRegister directly and gets
 * it from its own dependency libcudart.so.12, and Python loads it RTLD_LOCAL, so that libcudart is not
 * in the global scope where the interposer's RTLD_NEXT would look. */
#include <stddef.h>

int cudaHostRegister(void *p, size_t n, unsigned flags);
int cudaHostUnregister(void *p);

int torchlike_register(void *p, size_t n, unsigned flags) { return cudaHostRegister(p, n, flags); }
int torchlike_unregister(void *p) { return cudaHostUnregister(p); }
