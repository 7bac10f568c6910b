/* Helper for t_dlsym: the definition that RTLD_NEXT from libnext_a must find. */
const char *next_probe(void) { return "b"; }
