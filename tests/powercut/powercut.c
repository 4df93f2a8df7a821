/* A power cut for the durability tests: LD_PRELOAD'ed into `pzq serve`, it passes every write to the
 * LMDB data file through and also journals it, marking which writes an fsync/fdatasync (or an O_DSYNC
 * descriptor) made durable. After a SIGKILL, tests/powercut/rebuild.py replays only the durable writes:
 * the file a machine would find after losing power at that instant, with the worst page cache.
 *
 * PZQ_POWERCUT_JOURNAL=<path> turns it on; only files whose name ends in "data.mdb" are journaled.
 * PZQ_POWERCUT_AT_SYNC=<n> cuts the power itself (SIGKILL) at the first sync of the data file from the
 * n-th on that finds a meta page written and not yet durable: the instant between commit N's meta write
 * and the data sync that would carry it, where no answer that depends on commit N may have left.
 * PZQ_POWERCUT_FAIL_SYNC=<n>: that sync fails with EIO instead (as a disk that lost the write says),
 * and the process goes on; its journal gets an 'F': every write not yet durable is lost, as a kernel that
 * drops the pages of a failed writeback (a later sync reports success without them).
 * Journal records: 'W' u64 offset, u32 length, bytes (not yet durable); 'D' the same, durable at once
 * (O_DSYNC); 'S' (every earlier write of the file is durable). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FD 65536
static signed char known[MAX_FD]; /* 0 unknown, 1 data file, -1 other */
static int journal = -1;
static long cut_at_sync = 0;       /* 0: no cut of its own */
static long fail_sync = 0;         /* 0: no sync fails */
static long syncs_seen = 0;
static int meta_pending = 0;       /* a meta page written since the last sync */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_close)(int);

static void init(void) {
    if (real_write) return;
    real_write = dlsym(RTLD_NEXT, "write");
    real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    real_pwrite64 = dlsym(RTLD_NEXT, "pwrite64");
    real_writev = dlsym(RTLD_NEXT, "writev");
    real_pwritev = dlsym(RTLD_NEXT, "pwritev");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_close = dlsym(RTLD_NEXT, "close");
    const char *path = getenv("PZQ_POWERCUT_JOURNAL");
    if (path) journal = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    const char *cut = getenv("PZQ_POWERCUT_AT_SYNC");
    if (cut) cut_at_sync = atol(cut);
    const char *fail = getenv("PZQ_POWERCUT_FAIL_SYNC");
    if (fail) fail_sync = atol(fail);
}

static int is_data(int fd) {
    if (journal < 0 || fd < 0 || fd >= MAX_FD || fd == journal) return 0;
    if (!known[fd]) {
        char link[64], target[PATH_MAX];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, target, sizeof target - 1);
        target[n > 0 ? n : 0] = 0;
        known[fd] = (n >= 8 && strcmp(target + n - 8, "data.mdb") == 0) ? 1 : -1;
    }
    return known[fd] == 1;
}

static void put(const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = real_write(journal, c, n);
        if (w <= 0) abort(); /* a journal that cannot be written would make the test lie */
        c += w;
        n -= (size_t)w;
    }
}

static void record(int fd, uint64_t offset, const struct iovec *iov, int count, ssize_t written) {
    if (written <= 0) return;
    int flags = fcntl(fd, F_GETFL);
    char kind = (flags & (O_DSYNC | O_SYNC)) ? 'D' : 'W';
    uint32_t length = (uint32_t)written;
    pthread_mutex_lock(&lock);
    if (kind == 'W' && offset < 2 * 4096) meta_pending = 1; /* LMDB's two meta pages come first */
    put(&kind, 1);
    put(&offset, 8);
    put(&length, 4);
    size_t left = (size_t)written;
    for (int i = 0; i < count && left; i++) {
        size_t n = iov[i].iov_len < left ? iov[i].iov_len : left;
        put(iov[i].iov_base, n);
        left -= n;
    }
    pthread_mutex_unlock(&lock);
}

/* Before a sync of the data file: the power goes here when asked (see PZQ_POWERCUT_AT_SYNC), or the
 * sync fails (PZQ_POWERCUT_FAIL_SYNC, once): 1 when it must fail. */
static int before_sync(int fd) {
    if ((!cut_at_sync && !fail_sync) || !is_data(fd)) return 0;
    pthread_mutex_lock(&lock);
    syncs_seen++;
    int cut = cut_at_sync && syncs_seen >= cut_at_sync && meta_pending;
    int failed = fail_sync && syncs_seen >= fail_sync && meta_pending;
    if (failed) fail_sync = 0;
    pthread_mutex_unlock(&lock);
    if (failed) {
        char kind = 'F';
        pthread_mutex_lock(&lock);
        meta_pending = 0;
        put(&kind, 1);
        pthread_mutex_unlock(&lock);
        errno = EIO;
        return 1;
    }
    /* (the power goes during this sync: what libzmq's I/O threads were already sending leaves first) */
    if (cut) {
        usleep(200000);
        kill(getpid(), SIGKILL);
    }
    return 0;
}

static void synced(int fd) {
    char kind = 'S';
    pthread_mutex_lock(&lock);
    meta_pending = 0;
    put(&kind, 1);
    pthread_mutex_unlock(&lock);
    (void)fd;
}

ssize_t write(int fd, const void *buf, size_t n) {
    init();
    if (!is_data(fd)) return real_write(fd, buf, n);
    off_t at = lseek(fd, 0, SEEK_CUR);
    ssize_t w = real_write(fd, buf, n);
    struct iovec v = {(void *)buf, n};
    record(fd, (uint64_t)at, &v, 1, w);
    return w;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t offset) {
    init();
    ssize_t w = real_pwrite(fd, buf, n, offset);
    if (is_data(fd)) {
        struct iovec v = {(void *)buf, n};
        record(fd, (uint64_t)offset, &v, 1, w);
    }
    return w;
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t offset) {
    init();
    ssize_t w = real_pwrite64(fd, buf, n, offset);
    if (is_data(fd)) {
        struct iovec v = {(void *)buf, n};
        record(fd, (uint64_t)offset, &v, 1, w);
    }
    return w;
}

ssize_t writev(int fd, const struct iovec *iov, int count) {
    init();
    if (!is_data(fd)) return real_writev(fd, iov, count);
    off_t at = lseek(fd, 0, SEEK_CUR);
    ssize_t w = real_writev(fd, iov, count);
    record(fd, (uint64_t)at, iov, count, w);
    return w;
}

ssize_t pwritev(int fd, const struct iovec *iov, int count, off_t offset) {
    init();
    ssize_t w = real_pwritev(fd, iov, count, offset);
    if (is_data(fd)) record(fd, (uint64_t)offset, iov, count, w);
    return w;
}

int fsync(int fd) {
    init();
    if (before_sync(fd)) return -1;
    int r = real_fsync(fd);
    if (r == 0 && is_data(fd)) synced(fd);
    return r;
}

int fdatasync(int fd) {
    init();
    if (before_sync(fd)) return -1;
    int r = real_fdatasync(fd);
    if (r == 0 && is_data(fd)) synced(fd);
    return r;
}

int close(int fd) {
    init();
    if (fd >= 0 && fd < MAX_FD) known[fd] = 0;
    return real_close(fd);
}
