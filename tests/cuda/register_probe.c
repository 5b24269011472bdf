/* register_probe: what an attacker (or a plain client) does to the daemon's registration socket.
 *
 * register_probe flood SOCKET N SECS REOPEN
 *                                  opens N connections that never send (as many as it can),
 *                                  prints {"check":"flood","open":<n>}, holds them for SECS
 *                                  seconds and, with REOPEN 1, every 100 ms opens again each one
 *                                  the daemon closed; prints {"check":"flood","reopened":<n>}.
 * register_probe gone SOCKET NAME  a child connects and exits; once it is reaped the parent
 *                                  prints {"check":"gone"}, sends the registration (claiming NAME)
 *                                  on the child's connection and prints the answer:
 *                                  {"check":"answer","status":<s>,"text":"…"}
 * register_probe claim SOCKET NAME registers claiming NAME: prints the same answer line.
 * register_probe exiting SOCKET NAME N
 *                                  N times: a child connects, tells the parent and exits at
 *                                  once (after dirtying 4 MiB, so that its exit takes a while);
 *                                  the parent sends the registration on the child's connection
 *                                  without waiting for it, then reaps it. Prints
 *                                  {"check":"exiting","runs":N,"refused":<n>,"busy":<n>,
 *                                  "registered":{"<name>":<n>,…},"refusal":"<first refusal>"}
 * register_probe leader SOCKET NAME
 *                                  the main thread exits (pthread_exit) while another thread
 *                                  lives: once the kernel shows the leader a zombie, that thread
 *                                  registers; prints the answer line.
 * register_probe claims SOCKET PREFIX N
 *                                  registers N times, claiming PREFIX-0 … PREFIX-(N-1); prints
 *                                  {"check":"claims","ok":<n>,"refused":<n>,"refusal":"<first>"}
 *
 * The registration's wire format (libshare-abi/src/register.rs, wire.rs): a frame is a u32
 * little-endian length and the body; Hello = "LSRG" u16 version (1) u16 length, name;
 * Welcome = "LSWL" u16 version u8 status (0 ok, 2 ok and trusted, 1 refused, 3 busy) u16
 * length, text. Status -1: the daemon closed the connection without an answer. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static struct sockaddr_un addr;

static int open_conn(void) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_hello(int fd, const char *name) {
    unsigned char buf[600];
    size_t n = strlen(name);
    if (n > 512) n = 512;
    uint32_t body = 4 + 2 + 2 + (uint32_t)n;
    memcpy(buf, &body, 4); /* little-endian host */
    memcpy(buf + 4, "LSRG", 4);
    buf[8] = 1;
    buf[9] = 0;
    buf[10] = (unsigned char)(n & 0xff);
    buf[11] = (unsigned char)(n >> 8);
    memcpy(buf + 12, name, n);
    return send(fd, buf, 12 + n, MSG_NOSIGNAL) == (ssize_t)(12 + n) ? 0 : -1;
}

/* Reads the daemon's answer on fd: its status (-1: none) and text (NUL-terminated). */
static int read_answer(int fd, char *text, size_t cap) {
    unsigned char buf[4096];
    size_t have = 0;
    ssize_t r;
    text[0] = 0;
    while (have < sizeof buf && (r = recv(fd, buf + have, sizeof buf - have, 0)) > 0) have += r;
    if (have < 4 + 9) return -1;
    unsigned char *w = buf + 4;
    size_t n = w[7] | (w[8] << 8);
    if (9 + n > have - 4) n = have - 4 - 9;
    if (n >= cap) n = cap - 1;
    memcpy(text, w + 9, n);
    text[n] = 0;
    return w[6];
}

static void print_json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\' || c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void print_answer(int fd) {
    char text[4096];
    int status = read_answer(fd, text, sizeof text);
    printf("{\"check\":\"answer\",\"status\":%d,\"text\":", status);
    print_json_string(text);
    printf("}\n");
}

/* What the daemon registered, counted by name. */
#define MAX_NAMES 16
static char names[MAX_NAMES][4096];
static int counts[MAX_NAMES];
static int n_names;

static void count_name(const char *name) {
    for (int i = 0; i < n_names; i++)
        if (!strcmp(names[i], name)) {
            counts[i]++;
            return;
        }
    if (n_names == MAX_NAMES) return;
    snprintf(names[n_names], sizeof names[0], "%s", name);
    counts[n_names++] = 1;
}

static void *leader_gone(void *arg) {
    const char *name = arg;
    /* Wait until the kernel shows the main thread a zombie (its stat's state Z). */
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)getpid());
    for (int i = 0; i < 5000; i++) {
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(stat, 1, sizeof stat - 1, f) : 0;
        if (f) fclose(f);
        stat[n] = 0;
        char *p = strrchr(stat, ')');
        if (p && p[1] == ' ' && p[2] == 'Z') break;
        usleep(1000);
    }
    int fd = open_conn();
    if (fd < 0) {
        printf("{\"check\":\"answer\",\"status\":-2,\"text\":\"cannot connect\"}\n");
        fflush(stdout);
        exit(1);
    }
    /* Refused at accept, the connection may be closed before the request: the refusal is
     * still there to read. */
    send_hello(fd, name);
    print_answer(fd);
    fflush(stdout);
    exit(0);
}

static int closed(int fd) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    char c[256];
    return recv(fd, c, sizeof c, MSG_DONTWAIT) <= 0 || (p.revents & (POLLHUP | POLLERR));
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, argv[2], sizeof addr.sun_path - 1);
    if (!strcmp(argv[1], "flood") && argc == 6) {
        int n = atoi(argv[3]);
        double secs = atof(argv[4]);
        int reopen = atoi(argv[5]);
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
            rl.rlim_cur = rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        int *fds = calloc(n, sizeof *fds);
        int open_ = 0;
        for (int i = 0; i < n; i++) {
            fds[i] = open_conn();
            open_ += fds[i] >= 0;
        }
        printf("{\"check\":\"flood\",\"open\":%d}\n", open_);
        fflush(stdout);
        long reopened = 0;
        for (int round = 0; round < (int)(secs * 10); round++) {
            usleep(100000);
            for (int i = 0; reopen && i < n; i++) {
                if (fds[i] >= 0 && !closed(fds[i])) continue;
                if (fds[i] >= 0) close(fds[i]);
                fds[i] = open_conn();
                reopened += fds[i] >= 0;
            }
        }
        printf("{\"check\":\"flood\",\"reopened\":%ld}\n", reopened);
        return 0;
    }
    if (!strcmp(argv[1], "gone") && argc == 4) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        pid_t child = fork();
        if (child == 0) {
            _exit(connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0);
        }
        int st;
        waitpid(child, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("{\"check\":\"answer\",\"status\":-2,\"text\":\"the child could not connect\"}\n");
            return 1;
        }
        printf("{\"check\":\"gone\"}\n");
        fflush(stdout);
        send_hello(fd, argv[3]);
        print_answer(fd);
        return 0;
    }
    if (!strcmp(argv[1], "exiting") && argc == 5) {
        int runs = atoi(argv[4]), refused = 0, busy = 0;
        char first[4096] = "";
        for (int i = 0; i < runs; i++) {
            int fd = socket(AF_UNIX, SOCK_STREAM, 0), go[2];
            if (fd < 0 || pipe(go) != 0) return 1;
            pid_t child = fork();
            if (child == 0) {
                static char dirty[4 << 20];
                memset(dirty, i, sizeof dirty);
                char ok = connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0;
                if (write(go[1], &ok, 1) != 1) _exit(2);
                _exit(0);
            }
            char ok = 0;
            if (read(go[0], &ok, 1) != 1 || !ok) return 1;
            close(go[0]);
            close(go[1]);
            char text[4096];
            /* A connection the daemon refused at accept may be closed already: its refusal is
             * still there to read. */
            send_hello(fd, argv[3]);
            int status = read_answer(fd, text, sizeof text);
            close(fd);
            waitpid(child, NULL, 0);
            if (status == 0 || status == 2) count_name(text);
            else if (status == 3) busy++;
            else {
                refused++;
                if (!first[0]) snprintf(first, sizeof first, "%s", text);
            }
        }
        printf("{\"check\":\"exiting\",\"runs\":%d,\"refused\":%d,\"busy\":%d,\"registered\":{", runs, refused, busy);
        for (int i = 0; i < n_names; i++) {
            if (i) putchar(',');
            print_json_string(names[i]);
            printf(":%d", counts[i]);
        }
        printf("},\"refusal\":");
        print_json_string(first);
        printf("}\n");
        return 0;
    }
    if (!strcmp(argv[1], "leader") && argc == 4) {
        pthread_t t;
        if (pthread_create(&t, NULL, leader_gone, argv[3]) != 0) return 1;
        pthread_exit(NULL);
    }
    if (!strcmp(argv[1], "claims") && argc == 5) {
        int n = atoi(argv[4]), ok = 0, refused = 0;
        char first[4096] = "", name[300], text[4096];
        for (int i = 0; i < n; i++) {
            snprintf(name, sizeof name, "%s-%d", argv[3], i);
            int fd = open_conn();
            int status = -1;
            text[0] = 0;
            if (fd >= 0) {
                send_hello(fd, name);
                status = read_answer(fd, text, sizeof text);
                close(fd);
            }
            if (status == 0 || status == 2) ok++;
            else {
                refused++;
                if (!first[0]) snprintf(first, sizeof first, "%s", text);
            }
        }
        printf("{\"check\":\"claims\",\"ok\":%d,\"refused\":%d,\"refusal\":", ok, refused);
        print_json_string(first);
        printf("}\n");
        return 0;
    }
    if (!strcmp(argv[1], "claim") && argc == 4) {
        int fd = open_conn();
        if (fd < 0 || send_hello(fd, argv[3]) != 0) return 1;
        print_answer(fd);
        return 0;
    }
    return 2;
}
