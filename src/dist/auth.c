/* Handshake proofs: HMAC-SHA256 from OpenSSL's libcrypto (see auth.h). */
#include "dist/internal/auth.h"

#include "dist/internal/sock.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>

#define STORE_LABEL "ringtrain store v1"
#define PEER_LABEL "ringtrain peer v1"
#define PEER_KEY_LABEL "ringtrain peer key v1"

bool rt_auth_equal(const uint8_t *a, const uint8_t *b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static rt_status hmac(const void *key, size_t keylen, const uint8_t *msg, size_t n, uint8_t out[RT_AUTH_MAC]) {
    unsigned int len = 0;
    static const uint8_t empty = 0; /* HMAC() wants a non-NULL key */
    if (!HMAC(EVP_sha256(), keylen ? key : &empty, (int)keylen, msg, n, out, &len) || len != RT_AUTH_MAC)
        return RT_ERROR(RT_ERR_INTERNAL, "HMAC-SHA256 failed (OpenSSL libcrypto)");
    return RT_OK;
}

/* label char | transcript, HMAC'd under key */
static rt_status proof(const void *key, size_t keylen, char side, const uint8_t *t, size_t n,
                       uint8_t out[RT_AUTH_MAC]) {
    uint8_t buf[160];
    if (n + 1 > sizeof buf) return RT_ERROR(RT_ERR_INTERNAL, "handshake transcript too long");
    buf[0] = (uint8_t)side;
    memcpy(buf + 1, t, n);
    return hmac(key, keylen, buf, n + 1, out);
}

rt_status rt_auth_store_proofs(const char *secret, const uint8_t ns[RT_AUTH_NONCE], const uint8_t nc[RT_AUTH_NONCE],
                               int rank, int world, uint8_t client[RT_AUTH_MAC], uint8_t server[RT_AUTH_MAC]) {
    uint8_t t[sizeof STORE_LABEL - 1 + 2 * RT_AUTH_NONCE + 8];
    size_t o = sizeof STORE_LABEL - 1;
    memcpy(t, STORE_LABEL, o);
    memcpy(t + o, ns, RT_AUTH_NONCE);
    memcpy(t + o + RT_AUTH_NONCE, nc, RT_AUTH_NONCE);
    put32(t + o + 2 * RT_AUTH_NONCE, (uint32_t)rank);
    put32(t + o + 2 * RT_AUTH_NONCE + 4, (uint32_t)world);
    size_t kl = strlen(secret);
    RT_CHECK(proof(secret, kl, 'C', t, sizeof t, client));
    RT_CHECK(proof(secret, kl, 'S', t, sizeof t, server));
    return RT_OK;
}

rt_status rt_auth_store_answer(const char *secret, const uint8_t ns[RT_AUTH_NONCE], int rank, int world,
                               uint8_t value[RT_STORE_HELLO_BYTES], uint8_t expect[RT_AUTH_MAC]) {
    rt_store_hello h = {.rank = rank, .world = world};
    RT_CHECK(rt_random_bytes(h.nonce, sizeof h.nonce));
    RT_CHECK(rt_auth_store_proofs(secret, ns, h.nonce, rank, world, h.mac, expect));
    rt_store_hello_encode(value, &h);
    return RT_OK;
}

rt_status rt_auth_store_verify(const char *secret, const uint8_t ns[RT_AUTH_NONCE], const uint8_t *value, size_t n,
                               rt_store_hello *h, uint8_t server_proof[RT_AUTH_MAC]) {
    if (rt_store_hello_parse(value, n, h) != RT_OK) return RT_ERROR(RT_ERR_PEER, "%s", RT_AUTH_REFUSED);
    uint8_t want[RT_AUTH_MAC];
    RT_CHECK(rt_auth_store_proofs(secret, ns, h->nonce, h->rank, h->world, want, server_proof));
    bool ok = rt_auth_equal(want, h->mac, RT_AUTH_MAC);
    OPENSSL_cleanse(want, sizeof want);
    if (!ok) {
        OPENSSL_cleanse(server_proof, RT_AUTH_MAC);
        return RT_ERROR(RT_ERR_PEER, "%s", RT_AUTH_REFUSED);
    }
    return RT_OK;
}

rt_status rt_auth_peer_key(const char *secret, const uint8_t launch[RT_TOKEN_BYTES], uint8_t key[RT_AUTH_MAC]) {
    uint8_t t[sizeof PEER_KEY_LABEL - 1 + RT_TOKEN_BYTES];
    memcpy(t, PEER_KEY_LABEL, sizeof PEER_KEY_LABEL - 1);
    memcpy(t + sizeof PEER_KEY_LABEL - 1, launch, RT_TOKEN_BYTES);
    return hmac(secret, strlen(secret), t, sizeof t, key);
}

rt_status rt_auth_peer_proofs(const uint8_t key[RT_AUTH_MAC], const uint8_t ni[RT_AUTH_NONCE],
                              const uint8_t nj[RT_AUTH_NONCE], int i, int j, int world, uint8_t conn[RT_AUTH_MAC],
                              uint8_t acc[RT_AUTH_MAC]) {
    uint8_t t[sizeof PEER_LABEL - 1 + 2 * RT_AUTH_NONCE + 12];
    size_t o = sizeof PEER_LABEL - 1;
    memcpy(t, PEER_LABEL, o);
    memcpy(t + o, ni, RT_AUTH_NONCE);
    memcpy(t + o + RT_AUTH_NONCE, nj, RT_AUTH_NONCE);
    put32(t + o + 2 * RT_AUTH_NONCE, (uint32_t)i);
    put32(t + o + 2 * RT_AUTH_NONCE + 4, (uint32_t)j);
    put32(t + o + 2 * RT_AUTH_NONCE + 8, (uint32_t)world);
    RT_CHECK(proof(key, RT_AUTH_MAC, 'C', t, sizeof t, conn));
    RT_CHECK(proof(key, RT_AUTH_MAC, 'A', t, sizeof t, acc));
    return RT_OK;
}

static rt_status send_hello(int fd, const rt_hello *h, uint64_t deadline_ns, const char *what) {
    uint8_t b[RT_HELLO_BYTES];
    rt_hello_encode(b, h);
    return rt_sock_write_all(fd, b, sizeof b, deadline_ns, what);
}

static rt_status recv_hello(int fd, rt_hello_step step, rt_hello *h, uint64_t deadline_ns, const char *what) {
    uint8_t b[RT_HELLO_BYTES];
    RT_CHECK(rt_sock_read_all(fd, b, sizeof b, deadline_ns, what));
    RT_CHECK(rt_hello_parse(b, sizeof b, h));
    if (h->step != step)
        return RT_ERROR(RT_ERR_PEER, "%s: handshake step %u where step %u was due", what, h->step, (unsigned)step);
    return RT_OK;
}

rt_status rt_auth_peer_connect(int fd, const uint8_t key[RT_AUTH_MAC], int me, int peer, int world,
                               uint64_t deadline_ns, const char *what) {
    rt_hello open = {.step = RT_HELLO_OPEN, .rank = me, .world = world}, ans;
    RT_CHECK(rt_random_bytes(open.nonce, sizeof open.nonce));
    RT_CHECK(send_hello(fd, &open, deadline_ns, what));
    RT_CHECK(recv_hello(fd, RT_HELLO_ANSWER, &ans, deadline_ns, what));
    rt_hello pr = {.step = RT_HELLO_PROOF, .rank = me, .world = world};
    uint8_t want[RT_AUTH_MAC];
    RT_CHECK(rt_auth_peer_proofs(key, open.nonce, ans.nonce, me, peer, world, pr.mac, want));
    if (ans.rank != peer || ans.world != world || !rt_auth_equal(want, ans.mac, RT_AUTH_MAC))
        return RT_ERROR(RT_ERR_PEER, "%s: the process there did not prove it is rank %d of this job", what, peer);
    return send_hello(fd, &pr, deadline_ns, what);
}

rt_status rt_auth_peer_accept(int fd, const uint8_t key[RT_AUTH_MAC], int me, int world, uint64_t deadline_ns,
                              int *peer) {
    const char *what = "connecting peer";
    rt_hello open, pr;
    RT_CHECK(recv_hello(fd, RT_HELLO_OPEN, &open, deadline_ns, what));
    if (open.world != world || open.rank <= me)
        return RT_ERROR(RT_ERR_PEER, "a peer claims rank %d of world size %d (expected a rank in %d..%d of %d)",
                        (int)open.rank, (int)open.world, me + 1, world - 1, world);
    rt_hello ans = {.step = RT_HELLO_ANSWER, .rank = me, .world = world};
    RT_CHECK(rt_random_bytes(ans.nonce, sizeof ans.nonce));
    uint8_t want[RT_AUTH_MAC];
    RT_CHECK(rt_auth_peer_proofs(key, open.nonce, ans.nonce, open.rank, me, world, want, ans.mac));
    RT_CHECK(send_hello(fd, &ans, deadline_ns, what));
    RT_CHECK(recv_hello(fd, RT_HELLO_PROOF, &pr, deadline_ns, what));
    if (pr.rank != open.rank || !rt_auth_equal(want, pr.mac, RT_AUTH_MAC))
        return RT_ERROR(RT_ERR_PEER, "a peer claiming rank %d did not prove it knows this job's secret",
                        (int)open.rank);
    *peer = open.rank;
    return RT_OK;
}
