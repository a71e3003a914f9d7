/*
 * clockshift: an LD_PRELOAD shim that shifts the wall clock of one process by an offset
 * the test can change while the process runs.
 *
 *   CLOCKSHIFT_FILE=/path/offset LD_PRELOAD=libclockshift.so redis-server ...
 *
 * The file holds a signed number of milliseconds as text ("3600000", "-5000"), padded
 * with spaces or newlines. It is mapped once, at load time, and parsed on every call, so
 * rewriting it in place (same length, no truncation: a mapped file cut to 0 bytes raises
 * SIGBUS in the reader) moves the clock at once. Missing or unreadable file: offset 0.
 *
 * Shifted: clock_gettime(CLOCK_REALTIME / CLOCK_REALTIME_COARSE / CLOCK_TAI),
 * gettimeofday, time. Monotonic clocks are not touched (a real NTP step does not move
 * them either). Every clock read is a raw syscall: no dlsym(RTLD_NEXT) and no malloc,
 * which is what makes Debian's libfaketime hang redis-server (jemalloc initialisation
 * re-enters the time functions).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MAP_LEN 64

static const volatile char *offset_map = NULL;
static volatile long long last_good_ms = 0;

__attribute__((constructor)) static void clockshift_init(void) {
    const char *path = getenv("CLOCKSHIFT_FILE");
    if (path == NULL || path[0] == '\0') {
        return;
    }
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return;
    }
    void *m = mmap(NULL, MAP_LEN, PROT_READ, MAP_SHARED, fd, 0);
    syscall(SYS_close, fd);
    if (m != MAP_FAILED) {
        offset_map = (const volatile char *)m;
    }
}

/* The current offset in ms; the last value that parsed when the file is mid-rewrite. */
static long long offset_ms(void) {
    const volatile char *p = offset_map;
    if (p == NULL) {
        return 0;
    }
    size_t i = 0;
    while (i < MAP_LEN && (p[i] == ' ' || p[i] == '\n' || p[i] == '\t')) {
        i++;
    }
    int neg = 0;
    if (i < MAP_LEN && p[i] == '-') {
        neg = 1;
        i++;
    }
    long long v = 0;
    int digits = 0;
    while (i < MAP_LEN && p[i] >= '0' && p[i] <= '9' && digits < 15) {
        v = v * 10 + (p[i] - '0');
        digits++;
        i++;
    }
    if (digits == 0) {
        return last_good_ms;
    }
    v = neg ? -v : v;
    last_good_ms = v;
    return v;
}

static int raw_clock_gettime(clockid_t clk, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, clk, ts);
}

static void shift(struct timespec *ts) {
    long long off = offset_ms();
    if (off == 0) {
        return;
    }
    long long ns = (long long)ts->tv_nsec + (off % 1000) * 1000000LL;
    long long sec = (long long)ts->tv_sec + off / 1000;
    while (ns < 0) {
        ns += 1000000000LL;
        sec -= 1;
    }
    while (ns >= 1000000000LL) {
        ns -= 1000000000LL;
        sec += 1;
    }
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)ns;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    int rc = raw_clock_gettime(clk, ts);
    if (rc == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE || clk == CLOCK_TAI)) {
        shift(ts);
    }
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    if (tz != NULL) {
        struct timezone *z = (struct timezone *)tz;
        z->tz_minuteswest = 0;
        z->tz_dsttime = 0;
    }
    struct timespec ts;
    int rc = raw_clock_gettime(CLOCK_REALTIME, &ts);
    if (rc != 0) {
        return rc;
    }
    shift(&ts);
    /* glibc declares tv nonnull; a NULL is still tolerated, as the real call does. */
    struct timeval *volatile out = tv;
    if (out != NULL) {
        out->tv_sec = ts.tv_sec;
        out->tv_usec = ts.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *t) {
    struct timespec ts;
    if (raw_clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return (time_t)-1;
    }
    shift(&ts);
    if (t != NULL) {
        *t = ts.tv_sec;
    }
    return ts.tv_sec;
}
