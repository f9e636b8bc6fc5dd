/* Wire formats of the communicator: store frames, transport hellos, message headers.
 *
 * Everything that crosses a socket or a shared-memory ring is parsed here, by pure
 * functions over a byte buffer, so the parsers can be fuzzed without sockets. Every
 * frame carries a magic number and explicit lengths; lengths are checked against hard
 * limits before anything is allocated, so an oversize or malformed frame is an error
 * (RT_ERR_FORMAT), never a crash or a huge allocation. Integers are little-endian.
 */
#ifndef RT_DIST_WIRE_H
#define RT_DIST_WIRE_H

#include "core/status.h"
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- store frames: header (12 bytes) + key + value ---- */
#define RT_STORE_MAGIC 0x31535452u /* "RTS1" */
#define RT_STORE_HDR 12
#define RT_STORE_MAX_KEY 1024
#define RT_STORE_MAX_VALUE (1u << 20)

typedef enum rt_store_op {
    RT_STORE_HELLO = 1, /* client's proof: value = rt_store_hello (RT_STORE_HELLO_BYTES) */
    RT_STORE_SET = 2,
    RT_STORE_GET = 3,       /* waits until the key exists */
    RT_STORE_ADD = 4,       /* value = decimal delta; reply value = new total */
    RT_STORE_CHECK = 5,     /* reply status 0 = exists, 1 = missing (never waits) */
    RT_STORE_REPLY = 6,     /* status 0 ok; else value = error text. To HELLO: value = the server's proof */
    RT_STORE_CHALLENGE = 7, /* the server's first frame: value = its nonce (RT_AUTH_NONCE bytes) */
    RT_STORE_DELETE = 8,    /* reply status 0 = deleted, 1 = missing */
    RT_STORE_OP_MAX_
} rt_store_op;

typedef struct rt_store_frame {
    uint8_t op, status;
    uint16_t keylen;
    uint32_t vallen;
    const uint8_t *key;   /* points into the parsed buffer */
    const uint8_t *value; /* points into the parsed buffer */
} rt_store_frame;

/* Parse one frame from buf[0..len). RT_OK and *consumed > 0 when a whole frame is
 * there; RT_OK and *consumed == 0 when more bytes are needed; RT_ERR_FORMAT on a bad
 * magic, unknown op or a length over the limits. */
rt_status rt_store_frame_parse(const uint8_t *buf, size_t len, rt_store_frame *out, size_t *consumed);
/* Validate a 12-byte header alone (lengths filled, key/value NULL). */
rt_status rt_store_header_parse(const uint8_t *hdr, rt_store_frame *out);
/* Encode a frame into out (capacity cap); returns bytes written or 0 if it does not fit
 * or the lengths are over the limits. */
size_t rt_store_frame_encode(uint8_t *out, size_t cap, uint8_t op, uint8_t status, const void *key, size_t keylen,
                             const void *value, size_t vallen);

/* ---- handshakes (see auth.h): nonces and HMAC-SHA256 proofs ---- */
#define RT_AUTH_NONCE 32
#define RT_AUTH_MAC 32

/* The value of a store HELLO: the client's nonce, the rank it claims (-1: not a rank),
 * the world size, and its proof HMAC(secret, transcript) (auth.h). */
#define RT_STORE_HELLO_BYTES (RT_AUTH_NONCE + 4 + 4 + RT_AUTH_MAC)
typedef struct rt_store_hello {
    uint8_t nonce[RT_AUTH_NONCE];
    int32_t rank, world;
    uint8_t mac[RT_AUTH_MAC];
} rt_store_hello;

void rt_store_hello_encode(uint8_t out[RT_STORE_HELLO_BYTES], const rt_store_hello *h);
/* Checks the length and the ranges (world 1..2^20, rank -1..world-1). */
rt_status rt_store_hello_parse(const uint8_t *buf, size_t len, rt_store_hello *out);

/* ---- transport hello: the three messages of the peer handshake (auth.h) ---- */
#define RT_HELLO_MAGIC 0x32485452u /* "RTH2" */
#define RT_TOKEN_BYTES 16          /* the per-launch nonce rank 0 publishes (rt/token) */
#define RT_HELLO_BYTES (4 + 4 + 4 + 4 + RT_AUTH_NONCE + RT_AUTH_MAC)

typedef enum rt_hello_step {
    RT_HELLO_OPEN = 1,   /* connecting rank: its rank, world size, nonce */
    RT_HELLO_ANSWER = 2, /* accepting rank: its rank, world size, nonce, proof */
    RT_HELLO_PROOF = 3,  /* connecting rank: its proof */
    RT_HELLO_STEP_MAX_
} rt_hello_step;

typedef struct rt_hello {
    uint8_t step; /* rt_hello_step */
    int32_t rank, world;
    uint8_t nonce[RT_AUTH_NONCE];
    uint8_t mac[RT_AUTH_MAC];
} rt_hello;

void rt_hello_encode(uint8_t out[RT_HELLO_BYTES], const rt_hello *h);
rt_status rt_hello_parse(const uint8_t *buf, size_t len, rt_hello *out);

/* ---- message header: precedes every point-to-point or collective transfer ---- */
#define RT_MSG_MAGIC 0x314d5452u /* "RTM1" */
#define RT_MSG_HDR 24
#define RT_MSG_MAX_BYTES ((uint64_t)1 << 40)

typedef struct rt_msg_hdr {
    uint16_t kind;  /* rt_comm_kind of the operation */
    uint16_t group; /* process-group id */
    uint32_t seq;   /* the operation's sequence number in its group (p2p: 0) */
    uint64_t nbytes;
} rt_msg_hdr;

void rt_msg_hdr_encode(uint8_t out[RT_MSG_HDR], const rt_msg_hdr *h);
/* Checks the magic and that nbytes is under RT_MSG_MAX_BYTES. */
rt_status rt_msg_hdr_parse(const uint8_t *buf, size_t len, rt_msg_hdr *out);

#ifdef __cplusplus
}
#endif

#endif
