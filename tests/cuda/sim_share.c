/* Shareable (POSIX file-descriptor) handles between two processes, as NVIDIA's memMapIPCDrv and
 * streamOrderedAllocationIPC samples use them (driver API, linked with -lcuda).
 *
 * The program forks before cuInit: the parent exports, the child imports (it may run in another
 * container: SHARE_IMPORTER_CONTAINER becomes its LIBSHARE_CONTAINER). The parent makes a VMM
 * allocation (cuMemCreate with requestedHandleTypes = POSIX_FD, 4 MiB of 0xA1) and a pool
 * allocation (a POSIX_FD pool, 8 MiB of 0xC3), sends both descriptors over a unix socket
 * (SCM_RIGHTS) with the pointer's export data; the child imports and maps them, reads the bytes,
 * writes 0xB2 / 0xD4 over them, and the parent reads those back. Then:
 *   sim_share both            both free (the importer first), the parent prints {"check":"share",...}
 *   sim_share hold_importer   the parent prints {"check":"share",...,"child":PID} and waits for a line on
 *                             stdin (the test kills the child with -9), then frees: {"check":"freed",...}
 *   sim_share hold_exporter   the parent prints {"check":"share",...} and waits on stdin (the test kills
 *                             it with -9); the child, seeing it gone, reads the bytes again and frees:
 *                             {"check":"importer",...}
 *   sim_share meminfo         cuMemGetInfo (with the shim: returns dead processes' memory to the
 *                             container's quota, as any process of the container does), prints
 *                             {"check":"meminfo","free":...,"total":...} */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

#define VMM_SIZE (4u << 20)
#define POOL_SIZE (8u << 20)

struct msg {
    CUmemPoolPtrExportData data;
    size_t vmm_size, pool_size;
};

static void send_fds(int sock, int fd0, int fd1, const struct msg *m) {
    char ctrl[CMSG_SPACE(2 * sizeof(int))];
    memset(ctrl, 0, sizeof ctrl);
    struct iovec iov = {(void *)m, sizeof *m};
    struct msghdr h = {0};
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    h.msg_control = ctrl;
    h.msg_controllen = sizeof ctrl;
    struct cmsghdr *c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(2 * sizeof(int));
    int fds[2] = {fd0, fd1};
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    EXPECT(sendmsg(sock, &h, 0) == (ssize_t)sizeof *m, "sendmsg");
}

static void recv_fds(int sock, int *fd0, int *fd1, struct msg *m) {
    char ctrl[CMSG_SPACE(2 * sizeof(int))];
    struct iovec iov = {m, sizeof *m};
    struct msghdr h = {0};
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    h.msg_control = ctrl;
    h.msg_controllen = sizeof ctrl;
    EXPECT(recvmsg(sock, &h, MSG_WAITALL) == (ssize_t)sizeof *m, "recvmsg");
    struct cmsghdr *c = CMSG_FIRSTHDR(&h);
    EXPECT(c && c->cmsg_type == SCM_RIGHTS, "no descriptors received");
    int fds[2];
    memcpy(fds, CMSG_DATA(c), sizeof fds);
    *fd0 = fds[0];
    *fd1 = fds[1];
}

static void context(void) {
    CUdevice d;
    CUcontext c;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&d, 0));
    CHECK(cuDevicePrimaryCtxRetain(&c, d));
    CHECK(cuCtxSetCurrent(c));
}

/* Every byte of [p, p + n) is v. */
static int all(CUdeviceptr p, size_t n, unsigned char v) {
    static unsigned char buf[POOL_SIZE];
    CHECK(cuMemcpyDtoH(buf, p, n));
    for (size_t i = 0; i < n; i++)
        if (buf[i] != v) return 0;
    return 1;
}

static void map(CUdeviceptr *va, size_t size, CUmemGenericAllocationHandle h) {
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(cuMemAddressReserve(va, size, 0, 0, 0));
    CHECK(cuMemMap(*va, size, 0, h, 0));
    CHECK(cuMemSetAccess(*va, size, &acc, 1));
}

static int importer(int sock, const char *mode) {
    const char *container = getenv("SHARE_IMPORTER_CONTAINER");
    if (container) setenv("LIBSHARE_CONTAINER", container, 1);
    context();
    int vfd, pfd;
    struct msg m;
    recv_fds(sock, &vfd, &pfd, &m);
    CUmemGenericAllocationHandle h;
    CHECK(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)vfd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(vfd);
    CUmemAllocationProp prop;
    CHECK(cuMemGetAllocationPropertiesFromHandle(&prop, h));
    CUdeviceptr va;
    map(&va, m.vmm_size, h);
    CUmemoryPool pool;
    CHECK(cuMemPoolImportFromShareableHandle(&pool, (void *)(uintptr_t)pfd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    close(pfd);
    CUdeviceptr p;
    CHECK(cuMemPoolImportPointer(&p, pool, &m.data));
    int r[3] = {all(va, m.vmm_size, 0xA1), all(p, m.pool_size, 0xC3),
                prop.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR};
    CHECK(cuMemsetD8(va, 0xB2, m.vmm_size));
    CHECK(cuMemsetD8(p, 0xD4, m.pool_size));
    CHECK(cuCtxSynchronize());
    EXPECT(write(sock, r, sizeof r) == sizeof r, "write");
    char c;
    if (!strcmp(mode, "hold_importer")) {
        while (read(sock, &c, 1) > 0) {
        }
        return 0; /* killed before this */
    }
    if (!strcmp(mode, "hold_exporter")) {
        while (read(sock, &c, 1) > 0) {
        }
        /* The exporter is gone (kill -9): the memory it shared is still what was written. */
        int after[2] = {all(va, m.vmm_size, 0xB2), all(p, m.pool_size, 0xD4)};
        CHECK(cuMemUnmap(va, m.vmm_size));
        CHECK(cuMemRelease(h));
        CHECK(cuMemAddressFree(va, m.vmm_size));
        CHECK(cuMemFreeAsync(p, 0));
        CHECK(cuStreamSynchronize(0));
        CHECK(cuMemPoolDestroy(pool));
        printf("{\"check\":\"importer\",\"vmm_after\":%d,\"pool_after\":%d}\n", after[0], after[1]);
        return 0;
    }
    CHECK(cuMemUnmap(va, m.vmm_size));
    CHECK(cuMemRelease(h));
    CHECK(cuMemAddressFree(va, m.vmm_size));
    int twice[2];
    CHECK(cuMemFree(p));
    twice[0] = (int)cuMemFree(p); /* freed already */
    twice[1] = (int)cuMemRelease(h);
    CHECK(cuMemPoolDestroy(pool));
    EXPECT(write(sock, twice, sizeof twice) == sizeof twice, "write");
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "both";
    if (!strcmp(mode, "meminfo")) {
        size_t free_b = 0, total = 0;
        context();
        CHECK(cuMemGetInfo(&free_b, &total));
        printf("{\"check\":\"meminfo\",\"free\":%zu,\"total\":%zu}\n", free_b, total);
        return 0;
    }
    int sv[2];
    EXPECT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
    fflush(stdout);
    pid_t child = fork();
    EXPECT(child >= 0, "fork");
    if (child == 0) {
        close(sv[0]);
        return importer(sv[1], mode);
    }
    close(sv[1]);
    int sock = sv[0];
    context();
    /* A VMM allocation made shareable as a file descriptor. */
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h;
    CHECK(cuMemCreate(&h, VMM_SIZE, &prop, 0));
    CUdeviceptr va;
    map(&va, VMM_SIZE, h);
    CHECK(cuMemsetD8(va, 0xA1, VMM_SIZE));
    int vfd = -1;
    CHECK(cuMemExportToShareableHandle(&vfd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    /* A memory pool made shareable, and one of its allocations. */
    CUmemPoolProps pp = {0};
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pp.location.id = 0;
    CUmemoryPool pool;
    CHECK(cuMemPoolCreate(&pool, &pp));
    CUdeviceptr p;
    CHECK(cuMemAllocFromPoolAsync(&p, POOL_SIZE, pool, 0));
    CHECK(cuMemsetD8Async(p, 0xC3, POOL_SIZE, 0));
    CHECK(cuStreamSynchronize(0));
    int pfd = -1;
    CHECK(cuMemPoolExportToShareableHandle(&pfd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    struct msg m;
    memset(&m, 0, sizeof m);
    CHECK(cuMemPoolExportPointer(&m.data, p));
    m.vmm_size = VMM_SIZE;
    m.pool_size = POOL_SIZE;
    send_fds(sock, vfd, pfd, &m);
    close(vfd);
    close(pfd);
    int r[3] = {0, 0, 0};
    EXPECT(read(sock, r, sizeof r) == sizeof r, "the importer failed");
    /* What the importer wrote. */
    int back[2] = {all(va, VMM_SIZE, 0xB2), all(p, POOL_SIZE, 0xD4)};
    printf("{\"check\":\"share\",\"vmm_read\":%d,\"pool_read\":%d,\"prop\":%d,\"vmm_back\":%d,"
           "\"pool_back\":%d,\"child\":%d}\n",
           r[0], r[1], r[2], back[0], back[1], (int)child);
    fflush(stdout);
    if (!strcmp(mode, "hold_exporter")) {
        char line[16];
        while (fgets(line, sizeof line, stdin)) {
        }
        return 0; /* killed before this */
    }
    int twice[2] = {-1, -1};
    if (!strcmp(mode, "hold_importer")) {
        char line[16];
        EXPECT(fgets(line, sizeof line, stdin) != NULL, "stdin");
    } else {
        EXPECT(read(sock, twice, sizeof twice) == sizeof twice, "the importer failed to free");
    }
    int status = 0;
    close(sock);
    waitpid(child, &status, 0);
    CHECK(cuMemUnmap(va, VMM_SIZE));
    CHECK(cuMemRelease(h));
    CHECK(cuMemAddressFree(va, VMM_SIZE));
    CHECK(cuMemFreeAsync(p, 0));
    CHECK(cuStreamSynchronize(0));
    CHECK(cuMemPoolDestroy(pool));
    printf("{\"check\":\"freed\",\"importer_free_twice\":%d,\"importer_release_twice\":%d,"
           "\"child_status\":%d}\n",
           twice[0], twice[1], status);
    return 0;
}
