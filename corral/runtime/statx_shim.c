/*
 * A shim preloaded into every program of a gVisor sandbox (its /etc/ld.so.preload names it): the
 * gVisor release Debian ships (20221219) answers EINVAL to a statx whose flags hold
 * AT_NO_AUTOMOUNT, which coreutils passes on every call, so `ls` and `stat` failed on any path.
 * gVisor's kernel has no automounts, so the flag asks for nothing there: the shim drops it and
 * calls the kernel's statx as glibc would. Built without the C library, it binds to the guest's
 * own glibc (`syscall`, errno) at load time, whichever version the image holds.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/syscall.h>

struct statx;
long syscall(long number, ...);

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    return (int)syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}
