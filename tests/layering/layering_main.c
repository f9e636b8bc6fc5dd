/* The program of the layering_links check (tests/layering/CMakeLists.txt): it calls
 * nothing; what is checked is that the whole area library links with rt_core alone. */
int main(void) { return 0; }
