/* Command-line helpers shared by the commands of src/cli: one way to take an option's
 * value (--opt value or --opt=value), strict numbers (no spaces, no trailing garbage,
 * in range), and an output path checked before long work starts. Each prints its own
 * message ("PROG: ...") and returns non-zero on a usage error. */
#ifndef RT_CLI_ARGS_H
#define RT_CLI_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* argv[*i] is `name` ("--batch") or "name=VALUE": 1 with *val set (and *i advanced past
 * a separate value), 0 when argv[*i] is another option, -1 (printed) when the value is
 * missing. */
int rt_cli_opt(const char *prog, int argc, char **argv, int *i, const char *name, const char **val);

/* argv[*i] is the flag `name` exactly: 1; "name=..." is a usage error: -1 (printed); else 0. */
int rt_cli_flag(const char *prog, const char *arg, const char *name);

/* A whole decimal number in lo..hi: optional '-', digits, nothing else (" 2", "3x",
 * "+1", "" are refused). 0 ok, -1 refused (nothing printed). */
int rt_cli_parse_i64(const char *text, int64_t lo, int64_t hi, int64_t *out);
int rt_cli_parse_int(const char *text, int lo, int hi, int *out);

/* A finite decimal number (digits, '.', exponent; no spaces, inf or nan) in lo..hi. */
int rt_cli_parse_double(const char *text, double lo, double hi, double *out);

/* A size in bytes with an optional K/M/G suffix (powers of 1024) and an optional B:
 * "8", "4K", "1.5M", "64MB"; at most 1 TiB. 0 ok, -1 refused (nothing printed). */
int rt_cli_parse_size(const char *text, size_t *out);

/* The output file `path` (given by option `opt`) can be written: created and removed
 * again if it did not exist, opened for writing (not truncated) if it did. On failure
 * prints "PROG: OPT PATH: cannot write: <errno text>" and returns -1. */
int rt_cli_check_output(const char *prog, const char *opt, const char *path);

#endif
