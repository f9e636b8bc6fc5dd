/* libFuzzer target: every parser of bytes that come from the network in src/dist —
 * store frames (as a stream of frames), the store's HELLO (and its proof check),
 * transport hellos, message headers — and a live store server fed the same bytes over a
 * real socket, either as they are (a stranger: the handshake's refusals) or, when the
 * first byte is odd, after a real handshake (a member: frames are handled, replies
 * sent, malformed clients dropped). The server must neither crash nor hang. */
#include "core/timer.h"
#include "dist/internal/auth.h"
#include "dist/internal/sock.h"
#include "dist/store.h"
#include "dist/internal/wire.h"

#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static rt_store_server *g_srv;
static int g_port;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a stream of store frames */
    size_t off = 0;
    while (off < size) {
        rt_store_frame f;
        size_t used = 0;
        if (rt_store_frame_parse(data + off, size - off, &f, &used) != RT_OK || used == 0) break;
        if (f.keylen) (void)f.key[f.keylen - 1];
        if (f.vallen) (void)f.value[f.vallen - 1];
        off += used;
    }
    if (size >= RT_STORE_HDR) {
        rt_store_frame f;
        (void)rt_store_header_parse(data, &f);
    }
    rt_hello h;
    (void)rt_hello_parse(data, size < RT_HELLO_BYTES ? size : RT_HELLO_BYTES, &h);
    static const uint8_t nonce[RT_AUTH_NONCE] = {1, 2, 3};
    rt_store_hello sh;
    uint8_t proof[RT_AUTH_MAC];
    (void)rt_auth_store_verify("fuzz", nonce, data, size < RT_STORE_HELLO_BYTES ? size : RT_STORE_HELLO_BYTES, &sh,
                               proof);
    rt_msg_hdr m;
    if (size >= RT_MSG_HDR) (void)rt_msg_hdr_parse(data, RT_MSG_HDR, &m);
    /* the live server */
    if (!g_srv && rt_store_server_start("127.0.0.1", 0, "fuzz", 4, &g_srv, &g_port) != RT_OK) return 0;
    int fd;
    if (rt_sock_connect("127.0.0.1", g_port, rt_now_ns() + 1000000000ull, "store", &fd) == RT_OK) {
        uint64_t hs = rt_now_ns() + 1000000000ull;
        if (size > 0 && (data[0] & 1)) { /* a member of the job: prove the secret first */
            uint8_t ch[RT_STORE_HDR + RT_AUTH_NONCE], val[RT_STORE_HELLO_BYTES], expect[RT_AUTH_MAC];
            uint8_t fr[RT_STORE_HDR + RT_STORE_HELLO_BYTES], rep[RT_STORE_HDR + RT_AUTH_MAC];
            if (rt_sock_read_all(fd, ch, sizeof ch, hs, "store") != RT_OK ||
                rt_auth_store_answer("fuzz", ch + RT_STORE_HDR, -1, 4, val, expect) != RT_OK ||
                rt_sock_write_all(fd, fr,
                                  rt_store_frame_encode(fr, sizeof fr, RT_STORE_HELLO, 0, NULL, 0, val, sizeof val), hs,
                                  "store") != RT_OK ||
                rt_sock_read_all(fd, rep, sizeof rep, hs, "store") != RT_OK ||
                !rt_auth_equal(rep + RT_STORE_HDR, expect, RT_AUTH_MAC))
                __builtin_trap(); /* the handshake of a client that knows the secret must pass */
            data++;
            size--;
        }
        size_t n = size > 65536 ? 65536 : size;
        (void)rt_sock_write_all(fd, data, n, rt_now_ns() + 1000000000ull, "store");
        shutdown(fd, SHUT_WR);
        uint8_t buf[4096];
        uint64_t deadline = rt_now_ns() + 200000000ull; /* a GET may wait forever: stop reading */
        for (;;) {
            struct pollfd p = {fd, POLLIN, 0};
            int ms = rt_sock_ms_left(deadline, 200);
            if (ms <= 0 || poll(&p, 1, ms) <= 0) break;
            if (recv(fd, buf, sizeof buf, 0) <= 0) break;
        }
        close(fd);
    }
    rt_error_clear();
    return 0;
}
