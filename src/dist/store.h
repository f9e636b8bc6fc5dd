/* The rendezvous key-value store: a small TCP server (hosted by rank 0 or by a
 * launcher) and its client.
 *
 * Operations: set, get (waits until the key exists), add (atomic counter), check,
 * wait. Every connection starts with a challenge-response (internal/auth.h): the server
 * sends a fresh nonce, the client proves with HMAC-SHA256 that it knows the job's secret
 * and the server proves it back; the secret itself never travels. Before that proof the
 * server answers nothing but one generic refusal, holds at most one small frame per
 * connection, at most RT_STORE_MAX_PENDING such connections (the oldest goes first),
 * each for at most RT_STORE_HANDSHAKE_S seconds. After it, the server rejects a
 * different world size, a rank out of range and a rank that already joined ("rank 1
 * already joined from ADDRESS"). Frames are length-checked (wire.h): a value up to
 * RT_STORE_MAX_VALUE bytes. Every client call has a deadline.
 */
#ifndef RT_DIST_STORE_H
#define RT_DIST_STORE_H

#include "core/status.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RT_STORE_MAX_PENDING 64  /* connections without a proof, at once */
#define RT_STORE_HANDSHAKE_S 5.0 /* seconds a connection has to prove the secret */

typedef struct rt_store_server rt_store_server;
typedef struct rt_store rt_store;

/* Start a server thread listening on host:port only (host NULL or "0.0.0.0": every
 * interface; port 0: ephemeral, see *bound_port). world: expected world size (ranks
 * 0..world-1); secret: the job secret every client must prove it knows. */
rt_status rt_store_server_start(const char *host, int port, const char *secret, int world, rt_store_server **out,
                                int *bound_port);
void rt_store_server_stop(rt_store_server *s);

/* Connect (retrying with backoff until timeout_s) and prove the secret (and check the
 * server's proof). rank -1: a client that is not a rank (a launcher), not counted for
 * duplicates. */
rt_status rt_store_connect(const char *host, int port, const char *secret, int rank, int world, double timeout_s,
                           rt_store **out);
void rt_store_close(rt_store *st);
/* Default timeout of get/wait calls (set by rt_store_connect). */
void rt_store_set_timeout(rt_store *st, double timeout_s);

rt_status rt_store_set(rt_store *st, const char *key, const void *value, size_t n);
/* Waits until the key exists (or the timeout), copies up to cap bytes; *n = value size. */
rt_status rt_store_get(rt_store *st, const char *key, void *buf, size_t cap, size_t *n);
rt_status rt_store_add(rt_store *st, const char *key, int64_t delta, int64_t *total);
rt_status rt_store_check(rt_store *st, const char *key, bool *exists);
/* The same with their own timeout (> 0; 0: the store's), leaving the store's default as it
 * is for other threads (the hang and desync checks use a short one: hangs.c). The wait for
 * the connection (another thread's request) counts in it. Their timeout does not break
 * the connection: the late reply is read and dropped by the next request (which times out
 * in turn while it has not come; so never get_within a key that may never be set). */
rt_status rt_store_set_within(rt_store *st, const char *key, const void *value, size_t n, double timeout_s);
rt_status rt_store_get_within(rt_store *st, const char *key, void *buf, size_t cap, size_t *n, double timeout_s);
rt_status rt_store_check_within(rt_store *st, const char *key, bool *exists, double timeout_s);
/* Remove a key (existed: whether it was there; may be NULL). A GET waiting for it waits on. */
rt_status rt_store_delete(rt_store *st, const char *key, bool *existed);
/* Whether another thread's request holds the connection now (a hint: the slow check skips
 * a round rather than wait). */
bool rt_store_busy(rt_store *st);
/* Waits until every key exists. */
rt_status rt_store_wait(rt_store *st, const char *const *keys, int n);
/* The local IPv4 address of the connection (the interface that reaches the store). */
const char *rt_store_local_addr(const rt_store *st);

#ifdef __cplusplus
}
#endif

#endif
