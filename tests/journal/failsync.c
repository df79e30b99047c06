/* An LD_PRELOAD shim for tests/journal/test_commit_sync_failure.py: the next N syncs
 * (fdatasync or fsync) of a file whose name ends in "-wal" fail with EIO, as a failing disk
 * answers SQLite's WAL sync at COMMIT.  Armed from the process it is preloaded into, through
 * ctypes: failsync_arm(N).  Every other call goes to libc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int armed;

void failsync_arm(int n) { armed = n; }

static int is_wal(int fd) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 4) return 0;
    path[n] = 0;
    return strcmp(path + n - 4, "-wal") == 0;
}

static int fails(int fd) {
    if (armed > 0 && is_wal(fd)) {
        armed--;
        errno = EIO;
        return 1;
    }
    return 0;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return fails(fd) ? -1 : real(fd);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return fails(fd) ? -1 : real(fd);
}
