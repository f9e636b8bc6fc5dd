/* Authentication of the rendezvous store and of the transport connections
 * (docs/security.md).
 *
 * Every job has a secret (rendezvous.h says where it comes from). Nobody sends it: a
 * client proves it knows it with HMAC-SHA256 (OpenSSL libcrypto) over a transcript that
 * holds a fresh nonce of each side, so a recorded proof is worthless on the next
 * connection, and the server proves it back with a differently labelled HMAC over the
 * same transcript, so a fake server learns nothing it can reuse and is detected.
 *
 * Store (one round trip; frames in wire.h):
 *   server -> client  CHALLENGE  Ns
 *   client -> server  HELLO      Nc, rank, world, HMAC(secret, "C" | T)
 *   server -> client  REPLY      HMAC(secret, "S" | T)        (or one generic refusal)
 *   T = "ringtrain store v1" | Ns | Nc | rank | world
 * Transport connections (rank i connects to rank j < i; rt_hello in wire.h), under a
 * key derived from the secret and the launch nonce rank 0 publishes in the store:
 *   i -> j  OPEN    i, world, Ni
 *   j -> i  ANSWER  j, world, Nj, HMAC(key, "A" | P)
 *   i -> j  PROOF   HMAC(key, "C" | P)
 *   P = "ringtrain peer v1" | Ni | Nj | i | j | world
 * Proofs are compared in constant time (CRYPTO_memcmp). */
#ifndef RT_DIST_AUTH_H
#define RT_DIST_AUTH_H

#include "core/status.h"
#include "dist/internal/wire.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The text of the one refusal the store sends for a missing, wrong or malformed proof. */
#define RT_AUTH_REFUSED "store: refused"

/* Equal in constant time. */
bool rt_auth_equal(const uint8_t *a, const uint8_t *b, size_t n);

/* Both proofs of a store handshake. */
rt_status rt_auth_store_proofs(const char *secret, const uint8_t ns[RT_AUTH_NONCE], const uint8_t nc[RT_AUTH_NONCE],
                               int rank, int world, uint8_t client[RT_AUTH_MAC], uint8_t server[RT_AUTH_MAC]);
/* Client: the HELLO value answering the challenge ns (a fresh nonce of its own), and the
 * proof the server must send back. */
rt_status rt_auth_store_answer(const char *secret, const uint8_t ns[RT_AUTH_NONCE], int rank, int world,
                               uint8_t value[RT_STORE_HELLO_BYTES], uint8_t expect[RT_AUTH_MAC]);
/* Server: check a HELLO value against the nonce this connection was sent. RT_OK: *h holds
 * the claim and server_proof the answer. Otherwise RT_ERR_PEER (malformed or a wrong
 * proof: the caller answers both alike, with RT_AUTH_REFUSED). */
rt_status rt_auth_store_verify(const char *secret, const uint8_t ns[RT_AUTH_NONCE], const uint8_t *value, size_t n,
                               rt_store_hello *h, uint8_t server_proof[RT_AUTH_MAC]);

/* The transport key of one launch: HMAC(secret, "ringtrain peer key v1" | launch nonce). */
rt_status rt_auth_peer_key(const char *secret, const uint8_t launch[RT_TOKEN_BYTES], uint8_t key[RT_AUTH_MAC]);
/* Both proofs of a transport handshake (connecting rank i, accepting rank j). */
rt_status rt_auth_peer_proofs(const uint8_t key[RT_AUTH_MAC], const uint8_t ni[RT_AUTH_NONCE],
                              const uint8_t nj[RT_AUTH_NONCE], int i, int j, int world, uint8_t conn[RT_AUTH_MAC],
                              uint8_t acc[RT_AUTH_MAC]);
/* The connecting side, on a connected socket: rank `me` expects rank `peer` there. */
rt_status rt_auth_peer_connect(int fd, const uint8_t key[RT_AUTH_MAC], int me, int peer, int world,
                               uint64_t deadline_ns, const char *what);
/* The accepting side: a peer that proves the key and claims a rank in me+1..world-1;
 * its rank goes to *peer. */
rt_status rt_auth_peer_accept(int fd, const uint8_t key[RT_AUTH_MAC], int me, int world, uint64_t deadline_ns,
                              int *peer);

#endif
