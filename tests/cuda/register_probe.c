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
 *
 * The registration's wire format (libshare-abi/src/register.rs, wire.rs): a frame is a u32
 * little-endian length and the body; Hello = "LSRG" u16 version (1) u16 length, name;
 * Welcome = "LSWL" u16 version u8 status (0 ok, 2 ok and trusted, 1 refused, 3 busy) u16
 * length, text. Status -1: the daemon closed the connection without an answer. */
#include <errno.h>
#include <poll.h>
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

static void print_answer(int fd) {
    unsigned char buf[4096];
    size_t have = 0;
    ssize_t r;
    while (have < sizeof buf && (r = recv(fd, buf + have, sizeof buf - have, 0)) > 0) have += r;
    if (have < 4 + 9) {
        printf("{\"check\":\"answer\",\"status\":-1,\"text\":\"\"}\n");
        return;
    }
    unsigned char *w = buf + 4;
    int status = w[6];
    size_t n = w[7] | (w[8] << 8);
    if (9 + n > have - 4) n = have - 4 - 9;
    printf("{\"check\":\"answer\",\"status\":%d,\"text\":\"", status);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = w[9 + i];
        if (c == '"' || c == '\\' || c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    printf("\"}\n");
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
    if (!strcmp(argv[1], "claim") && argc == 4) {
        int fd = open_conn();
        if (fd < 0 || send_hello(fd, argv[3]) != 0) return 1;
        print_answer(fd);
        return 0;
    }
    return 2;
}
