/*
 * An echo server in C on POSIX sockets over freeboard's C ABI: one thread, poll(), non-blocking
 * sockets, and nothing allocated — every connection's state and buffers are static arrays, the
 * way firmware on lwIP would hold them.
 *
 *   cc -O2 -I crates/freeboard-ffi/include crates/freeboard-ffi/examples/c/echo_server.c \
 *      target/release/libfreeboard_ffi.a -lpthread -ldl -lm -o echo_server
 *   ./echo_server 9001
 *
 * Messages are echoed as they stream in, without reassembly: every payload piece the core
 * returns goes straight back out as a frame of its own (the first with the message's opcode,
 * the others as continuations, the last with FIN). What the socket has not taken yet waits in
 * a send queue of chunks from one shared freeboard pool (fb_pool_*) over a static region: a
 * peer that sends a whole 16 MiB message before reading its echo (the Autobahn client does)
 * is served from the pool while the connection keeps reading. When the pool is exhausted the
 * connection stops reading until the socket has taken some of its queue (backpressure): memory
 * stays within the pool, whatever the peers do.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <arpa/inet.h>

#include "freeboard.h"

/* The handles' sizes are in the header, so they can live in static memory. */
_Static_assert(sizeof(FbConnection) == FB_CONNECTION_SIZE, "FbConnection size");
_Static_assert(sizeof(FbPool) == FB_POOL_SIZE, "FbPool size");

#define MAX_CLIENTS 32
#define RX_CAP (16 * 1024)
#define CHUNK_SIZE (16 * 1024)
#define POOL_CHUNKS 2048 /* 32 MiB: Autobahn's largest message (16 MiB) fits with room to spare */
#define QUEUE_CAP POOL_CHUNKS
#define LINGER_MS 2000

enum phase { FREE, HANDSHAKE, OPEN, LINGER };

struct client {
    int fd;
    enum phase phase;
    FbConnection ws; /* the handle lives in static memory, as on a microcontroller */
    uint8_t rx[RX_CAP];
    size_t rx_start, rx_end;
    /* The send queue: pool chunks in order; `sent` bytes of the first are on the wire. */
    uint32_t queue[QUEUE_CAP];
    size_t queue_head, queue_len, sent;
    uint64_t linger_until;
};

static struct client clients[MAX_CLIENTS];

/* The pool and the regions it is lent: static, like everything else here. */
static FbPool pool;
static uint8_t pool_data[(size_t)POOL_CHUNKS * CHUNK_SIZE];
static FbChunkSlot pool_chunks[POOL_CHUNKS];
static FbSegmentSlot pool_segments[1]; /* chains are not used through the C ABI */

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int queue_empty(const struct client *c) {
    return c->queue_len == 0;
}

/* Bytes the send queue can still take: the tail chunk's spare room plus the pool's free chunks
 * (shared with the other connections), within the queue's own capacity. */
static size_t queue_room(struct client *c) {
    size_t room = 0;
    if (c->queue_len > 0) {
        uint8_t *spare;
        size_t len;
        uint32_t tail = c->queue[(c->queue_head + c->queue_len - 1) % QUEUE_CAP];
        if (fb_pool_spare(&pool, tail, &spare, &len) == FB_OK) {
            room = len;
        }
    }
    FbPoolStats stats;
    fb_pool_stats(&pool, &stats);
    size_t chunks = stats.chunks_total - stats.chunks_in_use;
    if (chunks > QUEUE_CAP - c->queue_len) {
        chunks = QUEUE_CAP - c->queue_len;
    }
    return room + chunks * CHUNK_SIZE;
}

/* Appends bytes to the send queue; the caller checked queue_room. -1 if the pool ran dry. */
static int enqueue(struct client *c, const uint8_t *data, size_t len) {
    while (len > 0) {
        if (c->queue_len > 0) {
            uint32_t tail = c->queue[(c->queue_head + c->queue_len - 1) % QUEUE_CAP];
            int n = fb_pool_append(&pool, tail, data, len);
            if (n < 0) {
                return -1;
            }
            data += n;
            len -= (size_t)n;
            if (len == 0) {
                break;
            }
        }
        uint32_t chunk;
        if (c->queue_len == QUEUE_CAP || fb_pool_alloc(&pool, &chunk) != FB_OK) {
            return -1;
        }
        c->queue[(c->queue_head + c->queue_len++) % QUEUE_CAP] = chunk;
    }
    return 0;
}

static void release_queue(struct client *c) {
    while (c->queue_len > 0) {
        fb_pool_release(&pool, c->queue[c->queue_head]);
        c->queue_head = (c->queue_head + 1) % QUEUE_CAP;
        c->queue_len--;
    }
    c->sent = 0;
}

static void drop_client(struct client *c) {
    close(c->fd);
    release_queue(c);
    fb_connection_deinit(&c->ws);
    c->phase = FREE;
}

/* Writes as much of the send queue as the socket takes; 0 = fine, -1 = connection lost. */
static int flush(struct client *c) {
    while (c->queue_len > 0) {
        uint32_t head = c->queue[c->queue_head];
        const uint8_t *bytes;
        size_t len;
        if (fb_pool_bytes(&pool, head, &bytes, &len) != FB_OK) {
            return -1;
        }
        if (c->sent < len) {
            ssize_t n = send(c->fd, bytes + c->sent, len - c->sent, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                return 0;
            }
            if (n <= 0) {
                return -1;
            }
            c->sent += (size_t)n;
            if (c->sent < len) {
                continue;
            }
        }
        /* All of the head chunk is on the wire: give it back (a later append takes a new one). */
        fb_pool_release(&pool, head);
        c->queue_head = (c->queue_head + 1) % QUEUE_CAP;
        c->queue_len--;
        c->sent = 0;
    }
    return 0;
}

/* Moves the control frames the connection owes (pongs, close) into the send buffer. */
static void queue_control(struct client *c) {
    while (queue_room(c) >= FB_MAX_CONTROL_FRAME_LEN) {
        uint8_t frame[FB_MAX_CONTROL_FRAME_LEN];
        size_t n = 0;
        if (fb_connection_poll_transmit(&c->ws, NULL, frame, sizeof frame, &n) != 1) {
            return;
        }
        enqueue(c, frame, n);
    }
}

static void drain_events(struct client *c) {
    FbEvent event;
    while (fb_connection_poll_event(&c->ws, &event) == 1) {
        /* Pings are answered by the core (auto_pong); nothing else needs an action here. */
    }
}

/* Feeds the received bytes to the core while the send queue has room for what comes out. */
static void pump(struct client *c, uint64_t now) {
    for (;;) {
        queue_control(c);
        drain_events(c);
        if (c->rx_start == c->rx_end) {
            c->rx_start = c->rx_end = 0;
            return;
        }
        size_t room = queue_room(c);
        if (room < FB_MAX_HEADER_LEN + FB_MAX_CONTROL_FRAME_LEN + 1) {
            return; /* backpressure: the pool is dry; wait until a socket takes some bytes */
        }
        size_t avail = c->rx_end - c->rx_start;
        size_t limit = room - FB_MAX_HEADER_LEN - FB_MAX_CONTROL_FRAME_LEN;
        size_t len = avail < limit ? avail : limit;
        FbInput in;
        int rc = fb_connection_handle_input(&c->ws, now, c->rx + c->rx_start, len, &in);
        c->rx_start += in.consumed;
        if (rc < 0) {
            /* A protocol error: the core queued the close frame with in.close_code. */
            continue;
        }
        if (!in.has_payload) {
            continue;
        }
        uint8_t opcode = !in.message_start ? FB_OPCODE_CONTINUATION
                         : in.kind == FB_KIND_TEXT ? FB_OPCODE_TEXT
                                                   : FB_OPCODE_BINARY;
        uint8_t header[FB_MAX_HEADER_LEN];
        size_t n = 0;
        rc = fb_connection_send_header(&c->ws, opcode, in.message_fin, in.len, NULL, header,
                                       sizeof header, &n);
        if (rc != FB_OK) {
            continue; /* after the close handshake started: nothing more to echo */
        }
        enqueue(c, header, n); /* fits: room covers the header and the piece */
        enqueue(c, in.data, in.len);
    }
}

/* Answers the upgrade request once it is complete. */
static void handshake(struct client *c, uint64_t now) {
    FbHandshake hs;
    uint8_t response[512];
    int rc = fb_handshake_accept(c->rx, c->rx_end, RX_CAP, NULL, 0, response, sizeof response,
                                 &hs);
    if (rc == 0) {
        return; /* read more */
    }
    if (rc == FB_ERR_INSUFFICIENT_SIZE) {
        drop_client(c); /* cannot happen with 512 bytes and no subprotocol; never send a part */
        return;
    }
    if (enqueue(c, response, hs.response_len) < 0) {
        drop_client(c); /* no memory for even the answer: shed the connection */
        return;
    }
    if (rc < 0) {
        /* Refused: the answer (hs.status) is queued; send it, then close. */
        c->rx_start = c->rx_end = 0;
        c->phase = LINGER;
        c->linger_until = now + LINGER_MS;
        return;
    }
    FbConfig config;
    fb_config_default(&config);
    config.max_message_size = 64u << 20;
    config.max_frame_size = 64u << 20;
    fb_connection_init(&c->ws, FB_ROLE_SERVER, &config, now);
    c->rx_start = hs.head_len; /* the bytes after the head are the first frames */
    c->phase = OPEN;
    pump(c, now);
}

static void on_readable(struct client *c, uint64_t now) {
    if (c->rx_start > 0) {
        memmove(c->rx, c->rx + c->rx_start, c->rx_end - c->rx_start);
        c->rx_end -= c->rx_start;
        c->rx_start = 0;
    }
    if (c->rx_end == RX_CAP) {
        return;
    }
    ssize_t n = recv(c->fd, c->rx + c->rx_end, RX_CAP - c->rx_end, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        return;
    }
    if (c->phase == LINGER) {
        if (n <= 0) {
            drop_client(c); /* the peer closed its side too: done */
        }
        c->rx_start = c->rx_end = 0; /* discard: keeps unread bytes from turning into a reset */
        return;
    }
    if (n <= 0) {
        if (c->phase == OPEN) {
            fb_connection_handle_eof(&c->ws);
        }
        drop_client(c);
        return;
    }
    c->rx_end += (size_t)n;
    if (c->phase == HANDSHAKE) {
        handshake(c, now);
    } else {
        pump(c, now);
    }
}

/* After each turn: the server closes the TCP connection first once the close handshake is over
 * (RFC 6455 section 7.1.1), after its close frame has left. */
static void after_turn(struct client *c, uint64_t now) {
    if (c->phase == OPEN && fb_connection_state(&c->ws) == FB_STATE_CLOSED && queue_empty(c)) {
        queue_control(c);
        if (queue_empty(c)) {
            c->phase = LINGER;
            c->linger_until = now + LINGER_MS;
        }
    }
    if (c->phase == LINGER && queue_empty(c)) {
        shutdown(c->fd, SHUT_WR);
    }
}

static int listen_on(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 64) < 0) {
        perror("bind/listen");
        exit(1);
    }
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return fd;
}

static void accept_all(int listener, uint64_t now) {
    for (;;) {
        int fd = accept(listener, NULL, NULL);
        if (fd < 0) {
            return;
        }
        struct client *c = NULL;
        for (int i = 0; i < MAX_CLIENTS; i++) {
            if (clients[i].phase == FREE) {
                c = &clients[i];
                break;
            }
        }
        if (c == NULL) {
            close(fd); /* full: the static table is the admission limit */
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fcntl(fd, F_SETFL, O_NONBLOCK);
        c->fd = fd;
        c->phase = HANDSHAKE;
        c->rx_start = c->rx_end = 0;
        c->queue_head = c->queue_len = c->sent = 0;
        c->linger_until = now + 10000; /* the handshake must complete within 10 s */
    }
}

int main(int argc, char **argv) {
    int port = argc > 1 ? atoi(argv[1]) : 9001;
    signal(SIGPIPE, SIG_IGN);
    int listener = listen_on(port);
    size_t footprint = fb_pool_footprint(CHUNK_SIZE, POOL_CHUNKS, 1);
    int rc = fb_pool_init(&pool, footprint, CHUNK_SIZE, pool_data, sizeof pool_data, pool_chunks,
                          POOL_CHUNKS, pool_segments, 1);
    if (rc != FB_OK) {
        fprintf(stderr, "fb_pool_init: %s\n", fb_error_str(rc));
        return 1;
    }
    printf("freeboard C echo server on ws://127.0.0.1:%d/ (FbConnection is %d bytes)\n", port,
           (int)sizeof(FbConnection));
    fflush(stdout);

    struct pollfd fds[MAX_CLIENTS + 1];
    int owner[MAX_CLIENTS + 1];
    for (;;) {
        uint64_t now = now_ms();
        int64_t wait = -1;
        int nfds = 0;
        fds[nfds].fd = listener;
        fds[nfds].events = POLLIN;
        owner[nfds++] = -1;
        for (int i = 0; i < MAX_CLIENTS; i++) {
            struct client *c = &clients[i];
            if (c->phase == FREE) {
                continue;
            }
            uint64_t deadline = 0;
            if (c->phase == OPEN) {
                if (fb_connection_poll_timeout(&c->ws, &deadline) != 1) {
                    deadline = 0;
                }
            } else {
                deadline = c->linger_until;
            }
            if (deadline > 0) {
                int64_t left = deadline > now ? (int64_t)(deadline - now) : 0;
                wait = wait < 0 || left < wait ? left : wait;
            }
            short events = 0;
            if (c->rx_end < RX_CAP) {
                events |= POLLIN;
            }
            if (!queue_empty(c)) {
                events |= POLLOUT;
            }
            fds[nfds].fd = c->fd;
            fds[nfds].events = events;
            owner[nfds++] = i;
        }
        int ready = poll(fds, (nfds_t)nfds, (int)wait);
        if (ready < 0 && errno != EINTR) {
            perror("poll");
            return 1;
        }
        now = now_ms();
        if (fds[0].revents & POLLIN) {
            accept_all(listener, now);
        }
        for (int k = 1; k < nfds; k++) {
            struct client *c = &clients[owner[k]];
            if (c->phase == FREE) {
                continue;
            }
            if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) {
                on_readable(c, now);
                if (c->phase == FREE) {
                    continue;
                }
            }
            if (c->phase == OPEN) {
                uint64_t deadline;
                if (fb_connection_poll_timeout(&c->ws, &deadline) == 1 && deadline <= now) {
                    fb_connection_handle_timeout(&c->ws, now);
                }
                pump(c, now); /* the socket may have taken bytes: carry on where we stopped */
            } else if (c->linger_until > 0 && c->linger_until <= now) {
                drop_client(c);
                continue;
            }
            if (flush(c) < 0) {
                drop_client(c);
                continue;
            }
            after_turn(c, now);
        }
    }
}
