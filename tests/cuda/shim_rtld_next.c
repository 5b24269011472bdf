/* dlsym(RTLD_NEXT) through the shim (tests/tests/shim_resolution.rs). One source, two builds:
 * -DSHIM_RTLD_NEXT_LIB -shared: libshim_rtld_next.so, a preloadable library that wraps puts() and
 *   finds the real one with dlsym(RTLD_NEXT, "puts"), as interposers do;
 * otherwise: a program that calls puts() and then asks the library what RTLD_NEXT returned.
 * Output with the library preloaded: "[wrapped] hello from main", "next_is_libc=1" and
 * "dlsym_is_shim=1" when libshare.so is preloaded too. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifdef SHIM_RTLD_NEXT_LIB

static int (*next_puts)(const char *);

static void die(const char *msg) {
    ssize_t r = write(2, msg, strlen(msg));
    (void)r;
    _exit(97);
}

int puts(const char *s) {
    if (!next_puts) {
        void *p = dlsym(RTLD_NEXT, "puts");
        if (!p) die("shim_rtld_next: dlsym(RTLD_NEXT, puts) = NULL\n");
        Dl_info self, found;
        if (!dladdr((void *)puts, &self) || !dladdr(p, &found)) die("shim_rtld_next: dladdr\n");
        /* RTLD_NEXT relative to the wrong object returns this library's own puts: recursion. */
        if (found.dli_fbase == self.dli_fbase)
            die("shim_rtld_next: dlsym(RTLD_NEXT, puts) returned the wrapper itself\n");
        next_puts = (int (*)(const char *))p;
    }
    char buf[256];
    snprintf(buf, sizeof buf, "[wrapped] %s", s);
    return next_puts(buf);
}

/* 1 if RTLD_NEXT gave this library libc's puts. */
int shim_rtld_next_is_libc(void) {
    Dl_info info;
    if (!next_puts || !dladdr((void *)next_puts, &info) || !info.dli_fname) return 0;
    return strstr(info.dli_fname, "libc.so") != NULL;
}

#else

int main(void) {
    puts("hello from main");
    int (*probe)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "shim_rtld_next_is_libc");
    printf("next_is_libc=%d\n", probe ? probe() : -1);
    /* Which dlsym this process (and the wrapper) called: the shim's when it is preloaded. */
    Dl_info info;
    int shim = dladdr((void *)dlsym, &info) && info.dli_fname && strstr(info.dli_fname, "libshare");
    printf("dlsym_is_shim=%d\n", shim);
    return 0;
}

#endif
