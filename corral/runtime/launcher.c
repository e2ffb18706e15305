/* corral's sandbox launcher: the only host-side program that touches a sandbox's processes.
 *
 * It exists so that nothing a tenant chose (argv, environment, working directory) is ever in the
 * environment or on the command line of a process running on the host: the tenant's command reaches
 * the final execve inside the sandbox through a file descriptor, and only after every privilege is
 * gone. Built by corral with gcc against libseccomp; see corral/runtime/launcher.py.
 *
 *   launcher seccomp
 *       write the sandbox seccomp filter, as BPF, to stdout (bubblewrap's --seccomp for the init)
 *   launcher init [--channel FD]
 *       be the sandbox's pid 1 (bubblewrap --as-pid-1 execs this inside): not dumpable, so no process
 *       of the sandbox's uid can ptrace it, take its descriptors or read its /proc entries; say
 *       "ready" on stdout, then hold only /dev/null (and the guest channel), reap every orphan, and
 *       exit on a SIGTERM from outside the sandbox (SIGKILL from outside ends it too). With a channel
 *       (the runtime's listening socket, inherited on FD), run the commands the runtime sends over it:
 *       fork, and in the child, already the sandbox's unprivileged user under its filter, do what
 *       `exec` does last (see the guest channel below and corral/runtime/guest.py)
 *   launcher spawn UID GID [--netns FD] PROCS... -- PROGRAM ARG...
 *       join the cgroups (write our pid to each PROCS file), join the network namespace open on FD
 *       if given (the sandbox's network slot, owned by the host's user namespace: nothing inside can
 *       change its addresses, routes or filters), drop every supplementary group and become
 *       UID/GID, then exec PROGRAM (bubblewrap, then told --share-net) with the environment we were given
 *   launcher exec INIT_PID PID_NS UID GID SPEC_FD PROCS...
 *       run the command described in SPEC_FD inside the namespaces of INIT_PID (whose pid namespace
 *       must still be inode PID_NS: a recycled pid is refused) as UID/GID (ids inside
 *       the sandbox's user namespace), in its cgroups, with an empty bounding set, no_new_privs and
 *       the seccomp filter; exit with its status (128+N when killed by signal N)
 *   launcher exec --tty INIT_PID ...   (and exec-root --tty)
 *       the same, its standard descriptors a terminal (the slave of a pty the runtime opened in the
 *       sandbox's own devpts): the command leads a session of its own with that terminal as its
 *       controlling one (setsid, TIOCSCTTY), so job control and ^C reach it and never the launcher
 *   launcher exec-root INIT_PID PID_NS UID GID SPEC_FD PROCS...
 *       the same, in a sandbox whose user namespace maps a whole range of host uids (an image's
 *       sandbox): uid 0 inside is an unprivileged host uid, so the command keeps the bounding set of
 *       a container's root (ROOT_CAPS) and may gain it through a setuid binary of its image (sudo);
 *       no no_new_privs, the seccomp filter loaded while the launcher still holds capabilities there
 *   launcher serve-root INIT_PID PID_NS CHANNEL_FD PROCS...
 *       an image sandbox's command server: enter the sandbox as exec-root does, fork a server into its
 *       pid namespace and wait for it; the server (host root still, not dumpable) serves the guest channel
 *       listening on CHANNEL_FD as the init does, each command's child finishing what exec-root does
 *       as the user the request names (see serve_root and corral/runtime/commands.py)
 *   launcher disk FILE TARGET
 *       attach FILE (an ext4 file) to a loop device that frees itself with the mount, and mount it at
 *       TARGET nodev, nosuid, noatime (the disk pool does this ahead of any create)
 *   launcher rootfs UID GID COUNT IMAGE DISK_MNT USERNS LOWER MERGED
 *       make an image sandbox's root on its disk, mounted at DISK_MNT: make upper/ (owned by UID:GID,
 *       uid 0 inside) and work/ there; create a user namespace
 *       mapping 0..COUNT-1 to UID.. and GID.., owned by UID, nested ones forbidden, pinned at USERNS;
 *       clone the image's mount IMAGE read-only through that mapping at LOWER; mount the overlay of
 *       LOWER and DISK_MNT/upper at MERGED (nodev); LOWER is detached again (the overlay holds it)
 *   launcher allow-suid INIT_PID PID_NS
 *       in the mount namespace of INIT_PID, lift the nosuid bubblewrap puts on every mount from the
 *       sandbox's root mount alone (nodev stays): the image's sudo is setuid
 *   launcher check-spec
 *       decode a spec from stdin and print its fields, one per NUL-terminated string (for tests)
 *   launcher fs OP HEXPATH [ARG...]
 *       inside a sandbox, as its user: one of the data plane's file operations (stat, list, mkdir,
 *       move, remove, read, write, watch), answered as corral/agent/envd/helper.py answers it (see fs)
 *   launcher fs version
 *       print the fs mode's protocol, by which the runtime knows a sandbox's launcher serves it
 *
 * A spec is a sequence of NUL-terminated strings: the magic "corral-exec-1", the working directory,
 * the argument count, the arguments, the environment count, the KEY=VALUE entries.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <linux/loop.h>
#include <linux/sched.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <poll.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/capability.h>

#define SPEC_MAGIC "corral-exec-1"
#define MAX_SPEC_BYTES (8u << 20)
#define MAX_ITEMS 65536
#define EXIT_SETUP 125   /* the launcher itself failed: nothing of the tenant ran */
#define EXIT_NOEXEC 126  /* found but cannot be executed */
#define EXIT_NOTFOUND 127

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif
#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif

static void fail(const char *what) {
    fprintf(stderr, "corral-launcher: %s: %s\n", what, strerror(errno));
    _exit(EXIT_SETUP);
}

static void fail_msg(const char *what) {
    fprintf(stderr, "corral-launcher: %s\n", what);
    _exit(EXIT_SETUP);
}

/* ---- the seccomp filter ------------------------------------------------------------------------ */

/* Denied outright (EPERM): kernel surfaces a sandbox has no business with, in the spirit of the
 * default profiles of container runtimes. Names unknown to this libseccomp or arch are skipped. */
static const char *const DENIED[] = {
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module", "delete_module",
    "finit_module", "fsconfig", "fsmount", "fsopen", "fspick", "get_kernel_syms", "init_module",
    "io_uring_enter", "io_uring_register", "io_uring_setup", "ioperm", "iopl", "kexec_file_load",
    "kexec_load", "keyctl", "lookup_dcookie", "mount", "mount_setattr", "move_mount",
    "name_to_handle_at", "nfsservctl", "open_by_handle_at", "open_tree", "perf_event_open",
    "pivot_root", "process_vm_readv", "process_vm_writev", "query_module", "quotactl", "quotactl_fd",
    "reboot", "request_key", "setns", "settimeofday", "stime", "swapoff", "swapon", "_sysctl",
    "sysfs", "syslog", "umount", "umount2", "uselib", "userfaultfd", "ustat", "vm86", "vm86old",
    "adjtimex", "fanotify_init", "kcmp", "chroot",
    /* Taking another process's descriptor: the sandbox's init holds none worth taking (see init) and
     * is not dumpable, which the kernel checks too; this is the second lock on the same door. */
    "pidfd_getfd",
};

/* Namespace flags: creating namespaces is how most kernel attack surface is reached unprivileged. */
static const unsigned long NAMESPACE_FLAGS[] = {
    CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID,
    CLONE_NEWNET, CLONE_NEWTIME,
};

/* personality(2) values a normal program uses: PER_LINUX (0), PER_LINUX32 (0x8), UNAME26 (0x20000),
 * their union, and the query (0xffffffff); everything else (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC...)
 * weakens the process. */
#define PERSONALITY_BITS 0x20008ul

static scmp_filter_ctx build_filter(void) {
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (ctx == NULL) fail_msg("seccomp_init failed");
    /* Syscalls of another architecture (i386 on x86_64, x32) would bypass a filter written by number. */
    if (seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS) != 0)
        fail_msg("cannot set the bad-arch action");
    for (size_t i = 0; i < sizeof DENIED / sizeof *DENIED; i++) {
        int nr = seccomp_syscall_resolve_name(DENIED[i]);
        if (nr == __NR_SCMP_ERROR) continue;
        int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
        if (rc != 0 && rc != -EDOM) fail_msg("cannot add a seccomp rule");
    }
    for (size_t i = 0; i < sizeof NAMESPACE_FLAGS / sizeof *NAMESPACE_FLAGS; i++) {
        unsigned long f = NAMESPACE_FLAGS[i];
        if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, f, f)) ||
            seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, f, f)))
            fail_msg("cannot add the namespace rules");
    }
    /* clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc fall back to clone. */
    int clone3 = seccomp_syscall_resolve_name("clone3");
    if (clone3 != __NR_SCMP_ERROR && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), clone3, 0) != 0)
        fail_msg("cannot add the clone3 rule");
    /* A rule compares an argument once, so "not one of these" is spelt as bit patterns over the low
     * 32 bits (all the kernel reads): a bit outside the allowed ones set while bit 31 is clear, or
     * bit 31 set while some other bit is clear (only the all-ones query sets bit 31). */
    for (int b = 0; b < 31; b++) {
        unsigned long bit = 1ul << b, top = 1ul << 31;
        if (!(PERSONALITY_BITS & bit) &&
            seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(personality), 1,
                             SCMP_A0(SCMP_CMP_MASKED_EQ, bit | top, bit)) != 0)
            fail_msg("cannot add the personality rules");
        if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(personality), 1,
                             SCMP_A0(SCMP_CMP_MASKED_EQ, bit | top, top)) != 0)
            fail_msg("cannot add the personality rules");
    }
    return ctx;
}

/* ---- the spec ------------------------------------------------------------------------------------- */

struct spec {
    char *cwd;
    char **argv;
    char **envp;
};

static char *read_all(int fd, size_t *len) {
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    if (buf == NULL) fail("malloc");
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_SPEC_BYTES) fail_msg("spec too large");
            cap *= 2;
            buf = realloc(buf, cap);
            if (buf == NULL) fail("realloc");
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) fail("read spec");
        if (got == 0) break;
        n += (size_t)got;
    }
    *len = n;
    return buf;
}

/* The next NUL-terminated string at *pos, or NULL when the buffer ends without one. */
static char *next_string(char *buf, size_t len, size_t *pos) {
    if (*pos >= len) return NULL;
    char *start = buf + *pos;
    char *end = memchr(start, '\0', len - *pos);
    if (end == NULL) return NULL;
    *pos = (size_t)(end - buf) + 1;
    return start;
}

static char **read_list(char *buf, size_t len, size_t *pos) {
    char *count_text = next_string(buf, len, pos);
    if (count_text == NULL || *count_text == '\0') fail_msg("spec: missing count");
    char *end;
    errno = 0;
    unsigned long count = strtoul(count_text, &end, 10);
    if (errno != 0 || *end != '\0' || count > MAX_ITEMS) fail_msg("spec: bad count");
    char **items = calloc(count + 1, sizeof *items);
    if (items == NULL) fail("calloc");
    for (unsigned long i = 0; i < count; i++) {
        items[i] = next_string(buf, len, pos);
        if (items[i] == NULL) fail_msg("spec: truncated");
    }
    return items;
}

static struct spec parse_spec(int fd) {
    size_t len, pos = 0;
    char *buf = read_all(fd, &len);
    struct spec s;
    char *magic = next_string(buf, len, &pos);
    if (magic == NULL || strcmp(magic, SPEC_MAGIC) != 0) fail_msg("spec: bad magic");
    s.cwd = next_string(buf, len, &pos);
    if (s.cwd == NULL || s.cwd[0] != '/') fail_msg("spec: cwd must be absolute");
    s.argv = read_list(buf, len, &pos);
    if (s.argv[0] == NULL) fail_msg("spec: empty command");
    s.envp = read_list(buf, len, &pos);
    if (pos != len) fail_msg("spec: trailing bytes");
    return s;
}

static void put_string(const char *s) { fwrite(s, 1, strlen(s) + 1, stdout); }

static int check_spec(void) {
    struct spec s = parse_spec(0);
    put_string(s.cwd);
    for (char **a = s.argv; *a; a++) put_string(*a);
    put_string("--");
    for (char **e = s.envp; *e; e++) put_string(*e);
    return fflush(stdout) == 0 ? 0 : 1;
}

/* ---- shared steps --------------------------------------------------------------------------------- */

static long parse_id(const char *text, const char *what) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0 || v > 0x7fffffff) {
        fprintf(stderr, "corral-launcher: bad %s %s\n", what, text);
        _exit(EXIT_SETUP);
    }
    return v;
}

static void join_cgroup(const char *procs) {
    int fd = open(procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail(procs);
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d", (int)getpid());
    if (write(fd, pid, (size_t)n) != n) fail(procs);
    close(fd);
}

static void become(uid_t uid, gid_t gid) {
    if (setresgid(gid, gid, gid) != 0) fail("setresgid");
    if (setresuid(uid, uid, uid) != 0) fail("setresuid");
}

/* ---- spawn: bubblewrap as the sandbox's host user, already in its cgroups --------------------------- */

static int spawn(int argc, char **argv) {
    if (argc < 4) fail_msg("usage: spawn UID GID [--netns FD] PROCS... -- PROGRAM ARG...");
    uid_t uid = (uid_t)parse_id(argv[0], "uid");
    gid_t gid = (gid_t)parse_id(argv[1], "gid");
    int i = 2;
    if (i + 1 < argc && strcmp(argv[i], "--netns") == 0) {
        int netns = (int)parse_id(argv[i + 1], "fd");
        if (setns(netns, CLONE_NEWNET) != 0) fail("setns(net)");
        close(netns);
        i += 2;
    }
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) join_cgroup(argv[i]);
    if (i + 1 >= argc) fail_msg("spawn: no program after --");
    if (geteuid() == 0) {
        if (setgroups(0, NULL) != 0) fail("setgroups");
        become(uid, gid);
    }
    execv(argv[i + 1], argv + i + 1);
    fail(argv[i + 1]);
    return EXIT_SETUP;
}

/* ---- exec: one command inside a running sandbox ----------------------------------------------------- */

static const struct {
    const char *name;
    int type;
} NAMESPACES[] = {
    /* The user namespace is joined last, by the child: until then we are host root, which may join
     * every other namespace whatever user namespace owns it (nested or not). */
    {"cgroup", CLONE_NEWCGROUP}, {"ipc", CLONE_NEWIPC}, {"uts", CLONE_NEWUTS},
    {"net", CLONE_NEWNET},       {"pid", CLONE_NEWPID}, {"mnt", CLONE_NEWNS},
    {"user", CLONE_NEWUSER},
};
#define N_NS (sizeof NAMESPACES / sizeof *NAMESPACES)

/* What root inside an image's sandbox keeps (a container runtime's default set): enough for package
 * managers (ownership, modes, setuid to their own users), nothing that administers the kernel. All
 * of it counts only in the sandbox's own user namespace. */
static const int ROOT_CAPS[] = {
    CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FSETID, CAP_FOWNER, CAP_SETGID, CAP_SETUID, CAP_SETPCAP,
    CAP_SETFCAP, CAP_NET_BIND_SERVICE, CAP_KILL, CAP_AUDIT_WRITE,
};

static void keep_root_caps(void) {
    for (int cap = 0; cap < 64; cap++) {
        int keep = 0;
        for (size_t i = 0; i < sizeof ROOT_CAPS / sizeof *ROOT_CAPS; i++) keep |= ROOT_CAPS[i] == cap;
        if (!keep && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) fail("PR_CAPBSET_DROP");
    }
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
}

static void drop_bounding_set(void) {
    for (int cap = 0; cap < 64; cap++) {
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) fail("PR_CAPBSET_DROP");
    }
    /* Ambient capabilities are cleared by the uid change anyway; say so explicitly. */
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
}

/* Whatever an exec runs is what the OOM killer should take first when the sandbox overruns its limit,
 * before the sandbox's skeleton (its pid 1, corral's init), which would end the whole sandbox. Raising
 * one's own score needs no privilege; lowering the skeleton's does, which not every host grants. */
#define WORKLOAD_OOM_SCORE_ADJ "500"

static void prefer_for_oom_kill(void) {
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return;
    if (write(fd, WORKLOAD_OOM_SCORE_ADJ, sizeof WORKLOAD_OOM_SCORE_ADJ - 1) < 0) {
        /* best effort: the limit holds either way */
    }
    close(fd);
}

/* Every descriptor above 2 but keep (-1: none). */
static void close_fds_except(int keep) {
#ifdef SYS_close_range
    if (keep < 3 && syscall(SYS_close_range, 3u, ~0u, 0u) == 0) return;
    if (keep >= 3 && (keep == 3 || syscall(SYS_close_range, 3u, (unsigned)keep - 1, 0u) == 0) &&
        syscall(SYS_close_range, (unsigned)keep + 1, ~0u, 0u) == 0)
        return;
#endif
    for (int fd = 3; fd < 65536; fd++)
        if (fd != keep) close(fd);
}

static void close_other_fds(void) { close_fds_except(-1); }

static void enter_cwd(const struct spec *s) {
    if (chdir(s->cwd) != 0) {
        fprintf(stderr, "%s: %s\n", s->cwd, strerror(errno));
        _exit(EXIT_SETUP);
    }
}

/* The final step of both paths: from here on nothing may fail silently, errors are reported the way
 * a shell does. */
static void run_command(const struct spec *s) {
    execvpe(s->argv[0], s->argv, s->envp);
    int err = errno;
    fprintf(stderr, "%s: %s\n", s->argv[0], err == ENOENT ? "command not found" : strerror(err));
    _exit(err == ENOENT ? EXIT_NOTFOUND : EXIT_NOEXEC);
}

/* Enter the namespaces of INIT_PID (whose pid namespace must still be inode PID_NS) and its cgroups
 * (the PROCS files), all but its user namespace, whose descriptor is left in fds[N_NS - 1]: the
 * caller's next child is then born in the sandbox's pid namespace, and joins the user one itself. */
static void enter_sandbox(long init, unsigned long long pid_ns, int nprocs, char **procs, int fds[N_NS]) {
    /* Every namespace is opened before any is joined: once in the sandbox's mount namespace, /proc is
     * the sandbox's and the init's pid means something else. */
    char path[64];
    for (size_t i = 0; i < N_NS; i++) {
        snprintf(path, sizeof path, "/proc/%ld/ns/%s", init, NAMESPACES[i].name);
        fds[i] = open(path, O_RDONLY | O_CLOEXEC);
        if (fds[i] < 0) fail(path);
        struct stat ns;
        if (NAMESPACES[i].type == CLONE_NEWPID && (fstat(fds[i], &ns) != 0 || ns.st_ino != pid_ns))
            fail_msg("the sandbox's init is gone (its pid now names another process)");
    }
    for (int i = 0; i < nprocs; i++) join_cgroup(procs[i]);
    /* Host root may join every namespace before the user namespace; a runtime that is not root owns
     * the sandbox's user namespace and must join it first to be allowed into the others. */
    int root = geteuid() == 0;
    if (root && setgroups(0, NULL) != 0) fail("setgroups");
    if (!root) {
        if (setns(fds[N_NS - 1], CLONE_NEWUSER) != 0) fail("user");
    }
    for (size_t i = 0; i + 1 < N_NS; i++) {
        if (setns(fds[i], NAMESPACES[i].type) != 0) fail(NAMESPACES[i].name);
        close(fds[i]);
    }
}

static unsigned long long parse_ns(const char *text) {
    char *end;
    errno = 0;
    unsigned long long ino = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0') fail_msg("bad pid namespace");
    return ino;
}

/* The filter a command of an image's sandbox runs under: without no_new_privs (its sudo is setuid),
 * so it is loaded while we still hold CAP_SYS_ADMIN in the sandbox's user namespace. */
static scmp_filter_ctx root_filter(void) {
    scmp_filter_ctx filter = build_filter();
    if (seccomp_attr_set(filter, SCMP_FLTATR_CTL_NNP, 0) != 0) fail_msg("cannot clear the filter's no_new_privs");
    return filter;
}

/* Root inside an image's sandbox, from every capability in its user namespace (just joined): a
 * container root's bounding set, the filter, then the command's user. */
static void become_inside(scmp_filter_ctx filter, uid_t uid, gid_t gid) {
    keep_root_caps();
    if (seccomp_load(filter) != 0) fail_msg("cannot load the seccomp filter");
    become(uid, gid);
}

static int exec_in(int argc, char **argv, int root_inside) {
    int tty = argc > 0 && strcmp(argv[0], "--tty") == 0;
    if (tty) {
        argc--;
        argv++;
    }
    if (argc < 5) fail_msg("usage: exec INIT_PID PID_NS UID GID SPEC_FD PROCS...");
    long init = parse_id(argv[0], "pid");
    unsigned long long pid_ns = parse_ns(argv[1]);
    uid_t uid = (uid_t)parse_id(argv[2], "uid");
    gid_t gid = (gid_t)parse_id(argv[3], "gid");
    int spec_fd = (int)parse_id(argv[4], "fd");
    struct spec s = parse_spec(spec_fd);
    close(spec_fd);
    scmp_filter_ctx filter = root_inside ? root_filter() : build_filter();
    int fds[N_NS];
    enter_sandbox(init, pid_ns, argc - 5, argv + 5, fds);
    int root = geteuid() == 0;
    pid_t child = fork();
    if (child < 0) fail("fork");
    if (child == 0) {
        /* A session of its own, led by the command, on its terminal: the tty's signals (^C, a
         * hangup, a resize's SIGWINCH) go to the command's process groups, never to the launcher. */
        if (tty && (setsid() < 0 || ioctl(STDIN_FILENO, TIOCSCTTY, 0) != 0)) fail("controlling terminal");
        /* Not dumpable until the final execve: with the sandbox's user namespace joined, its root
         * (an image's sandbox has one) would otherwise be allowed to ptrace us, still host root. */
        if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) fail("PR_SET_DUMPABLE");
        /* In the sandbox's pid namespace now. Joining its user namespace gives every capability
         * there, CAP_SETPCAP included, which is what it takes to empty the bounding set. */
        if (root && setns(fds[N_NS - 1], CLONE_NEWUSER) != 0) fail("user");
        close(fds[N_NS - 1]);
        prefer_for_oom_kill();
        if (root_inside) {
            become_inside(filter, uid, gid);
        } else {
            drop_bounding_set();
            become(uid, gid);
            if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail("PR_SET_NO_NEW_PRIVS");
        }
        close_other_fds();
        enter_cwd(&s);
        if (!root_inside && seccomp_load(filter) != 0) fail_msg("cannot load the seccomp filter");
        run_command(&s);
    }
    close(fds[N_NS - 1]);
    seccomp_release(filter);
    int status;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR) fail("waitpid");
    }
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

/* ---- rootfs: an image sandbox's root, made by host root before bubblewrap runs ------------------------ */

static void write_file(const char *path, const char *data) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail(path);
    size_t n = strlen(data);
    if (write(fd, data, n) != (ssize_t)n) fail(path);
    close(fd);
}

/* Attach FILE to a free loop device that frees itself once its last user (the mount) is gone. */
static void mount_disk(const char *file, const char *target) {
    int backing = open(file, O_RDWR | O_CLOEXEC);
    if (backing < 0) fail(file);
    int control = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (control < 0) fail("/dev/loop-control");
    char dev[64];
    int loop = -1;
    for (int attempt = 0; attempt < 64 && loop < 0; attempt++) {
        int n = ioctl(control, LOOP_CTL_GET_FREE);
        if (n < 0) fail("LOOP_CTL_GET_FREE");
        snprintf(dev, sizeof dev, "/dev/loop%d", n);
        int fd = open(dev, O_RDWR | O_CLOEXEC);
        if (fd < 0) fail(dev);
        struct loop_config config;
        memset(&config, 0, sizeof config);
        config.fd = (unsigned)backing;
        config.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
        if (ioctl(fd, LOOP_CONFIGURE, &config) == 0) {
            loop = fd;
        } else {
            int err = errno;
            /* Direct I/O needs an aligned backing file system; buffered I/O always works. */
            config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
            if (err == EINVAL && ioctl(fd, LOOP_CONFIGURE, &config) == 0) {
                loop = fd;
            } else {
                close(fd);
                if (err != EBUSY && errno != EBUSY) fail("LOOP_CONFIGURE");  /* EBUSY: taken meanwhile */
            }
        }
    }
    if (loop < 0) fail_msg("no free loop device");
    close(control);
    close(backing);
    if (mount(dev, target, "ext4", MS_NODEV | MS_NOSUID | MS_NOATIME, "") != 0) fail("mount disk");
    close(loop); /* the mount holds the device now; unmounting frees it */
}

static void make_dir(const char *path, mode_t mode, uid_t uid, gid_t gid) {
    if (mkdir(path, mode) != 0 && errno != EEXIST) fail(path);
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode)) fail_msg("the disk's layer directory is not one");
    if (chown(path, uid, gid) != 0 || chmod(path, mode) != 0) fail(path);
}

/* A user namespace mapping 0..count-1 to uid.. and gid.., owned by uid, pinned at PATH (a bind mount of
 * its nsfs file). Nested user namespaces are forbidden in it (max_user_namespaces 0). */
static int make_userns(uid_t uid, gid_t gid, unsigned long count, const char *pin) {
    int up[2], down[2];
    if (pipe2(up, O_CLOEXEC) != 0 || pipe2(down, O_CLOEXEC) != 0) fail("pipe");
    pid_t child = fork();
    if (child < 0) fail("fork");
    char byte = 0;
    if (child == 0) {
        close(up[0]);
        close(down[1]);
        if (setgroups(0, NULL) != 0) fail("setgroups");
        become(uid, gid);
        if (unshare(CLONE_NEWUSER) != 0) fail("unshare user");
        if (write(up[1], "u", 1) != 1) _exit(EXIT_SETUP);
        if (read(down[0], &byte, 1) != 1) _exit(EXIT_SETUP);
        /* Mapped now, and root of the namespace it made: forbid any namespace nested in it. */
        write_file("/proc/sys/user/max_user_namespaces", "0");
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    if (read(up[0], &byte, 1) != 1) fail_msg("the user namespace's helper failed");
    char path[64], map[96];
    snprintf(map, sizeof map, "0 %lu %lu\n", (unsigned long)uid, count);
    snprintf(path, sizeof path, "/proc/%d/uid_map", (int)child);
    write_file(path, map);
    snprintf(map, sizeof map, "0 %lu %lu\n", (unsigned long)gid, count);
    snprintf(path, sizeof path, "/proc/%d/gid_map", (int)child);
    write_file(path, map);
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)child);
    int ns = open(path, O_RDONLY | O_CLOEXEC);
    if (ns < 0) fail(path);
    int pinfd = open(pin, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (pinfd < 0) fail(pin);
    close(pinfd);
    if (mount(path, pin, NULL, MS_BIND, NULL) != 0) fail("pin the user namespace");
    if (write(down[1], "m", 1) != 1) fail("helper");
    int status;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR) fail("waitpid");
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("the user namespace's helper failed");
    return ns;
}

static int disk(int argc, char **argv) {
    if (argc != 2) fail_msg("usage: disk FILE TARGET");
    mount_disk(argv[0], argv[1]);
    return 0;
}

static int rootfs(int argc, char **argv) {
    if (argc != 8) fail_msg("usage: rootfs UID GID COUNT IMAGE DISK_MNT USERNS LOWER MERGED");
    uid_t uid = (uid_t)parse_id(argv[0], "uid");
    gid_t gid = (gid_t)parse_id(argv[1], "gid");
    unsigned long count = (unsigned long)parse_id(argv[2], "count");
    const char *image = argv[3], *disk_mnt = argv[4], *pin = argv[5];
    const char *lower = argv[6], *merged = argv[7];
    if (count == 0 || (unsigned long)uid + count > 0x7fffffffUL || (unsigned long)gid + count > 0x7fffffffUL)
        fail_msg("the uid range is out of bounds");
    char upper[4096], work[4096], options[3 * 4096 + 64];
    snprintf(upper, sizeof upper, "%s/upper", disk_mnt);
    snprintf(work, sizeof work, "%s/work", disk_mnt);
    make_dir(upper, 0755, uid, gid);
    make_dir(work, 0700, 0, 0);
    int ns = make_userns(uid, gid, count, pin);
    int tree = open_tree(AT_FDCWD, image, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (tree < 0) fail("open_tree");
    struct mount_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID;
    attr.userns_fd = (unsigned)ns;
    if (mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof attr) != 0) fail("mount_setattr idmap");
    if (move_mount(tree, "", AT_FDCWD, lower, MOVE_MOUNT_F_EMPTY_PATH) != 0) fail("move_mount");
    close(tree);
    close(ns);
    snprintf(options, sizeof options, "lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work);
    if (mount("overlay", merged, "overlay", MS_NODEV | MS_NOATIME, options) != 0) fail("mount overlay");
    if (umount2(lower, MNT_DETACH) != 0) fail("detach the lower layer");
    return 0;
}

static int allow_suid(int argc, char **argv) {
    if (argc != 2) fail_msg("usage: allow-suid INIT_PID PID_NS");
    long init = parse_id(argv[0], "pid");
    unsigned long long pid_ns = parse_ns(argv[1]);
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/ns/pid", init);
    int pid_fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat ns;
    if (pid_fd < 0 || fstat(pid_fd, &ns) != 0 || ns.st_ino != pid_ns)
        fail_msg("the sandbox's init is gone (its pid now names another process)");
    snprintf(path, sizeof path, "/proc/%ld/ns/mnt", init);
    int mnt = open(path, O_RDONLY | O_CLOEXEC);
    if (mnt < 0) fail(path);
    if (setns(mnt, CLONE_NEWNS) != 0) fail("mnt");
    if (mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_NODEV | MS_NOATIME, NULL) != 0) fail("remount /");
    return 0;
}

/* ---- init: the sandbox's pid 1, and its guest channel -------------------------------------------- */

#define READY "ready\n"

/* The guest channel: a SOCK_SEQPACKET unix socket the runtime bound in its own state directory (no
 * path to it exists inside the sandbox) and listened on before bubblewrap started; the init inherits
 * the listening descriptor and accepts the runtime's connections on it. Only fixed-size messages
 * cross it, so the init's decoder reads 16 bytes and a few descriptors, never tenant data: a command's
 * spec travels in a memfd that the forked child reads and parses (a bad one ends that child, never the
 * init). The init is not dumpable, so no process of the sandbox can take these descriptors. */
#define CHAN_MAGIC 0x31637263u /* "crc1" */
#define CHAN_EXEC 1u   /* fds: spec, stdin, stdout, stderr; value: the user (a command server's);
                        * answered STARTED (pid) or FAILED (errno) */
#define CHAN_SIGNAL 2u /* arg: the signal, for the process group of the job id; no answer */
#define CHAN_STARTED 1u
#define CHAN_EXITED 2u /* value: the shell's code (128+N for signal N) */
#define CHAN_FAILED 3u
#define CHAN_FDS 4
#define MAX_CONNS 8
#define MAX_JOBS 1024
#define MAX_USER 65535 /* the users a command server runs commands as: ids in an image's range */

struct chan_msg {
    uint32_t magic, type, id;
    int32_t value;
};

struct conn {
    int fd;
    unsigned gen;
    int blocked; /* its buffer was full: answers wait for POLLOUT */
};

/* A command the init started for a connection. Its answers (STARTED, then EXITED) are kept here
 * until the connection takes them, so none is lost to a runtime slower than its commands. */
struct job {
    pid_t pid; /* > 0 running, JOB_EXITED once reaped, 0 a free slot */
    uint32_t id;
    int conn;
    unsigned gen;
    int code;
    int started_unsent;
};
#define JOB_EXITED (-1)

static struct conn conns[MAX_CONNS];
static struct job jobs[MAX_JOBS];
static unsigned conn_gen;

static int job_of(const struct job *job, int c) { return job->conn == c && job->gen == conns[c].gen; }

static void conn_close(int c) {
    if (conns[c].fd < 0) return;
    for (int j = 0; j < MAX_JOBS; j++) {
        if (jobs[j].pid == JOB_EXITED && job_of(&jobs[j], c)) jobs[j].pid = 0;
    }
    close(conns[c].fd);
    conns[c].fd = -1;
}

/* 1 sent, 0 the connection's buffer is full (it is then polled for room), -1 the connection is gone. */
static int send_msg(int c, uint32_t type, uint32_t id, int32_t value) {
    struct chan_msg m = {CHAN_MAGIC, type, id, value};
    if (send(conns[c].fd, &m, sizeof m, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof m) return 1;
    if (errno == EAGAIN || errno == EINTR) {
        conns[c].blocked = 1;
        return 0;
    }
    conn_close(c);
    return -1;
}

/* Every answer the jobs of connection c hold, in order per job, until its buffer is full. */
static void flush(int c) {
    for (int j = 0; j < MAX_JOBS && conns[c].fd >= 0 && !conns[c].blocked; j++) {
        struct job *job = &jobs[j];
        if (job->pid == 0 || !job_of(job, c)) continue;
        if (job->started_unsent) {
            if (send_msg(c, CHAN_STARTED, job->id, job->pid > 0 ? job->pid : 0) != 1) return;
            job->started_unsent = 0;
        }
        if (job->pid == JOB_EXITED && send_msg(c, CHAN_EXITED, job->id, job->code) == 1) job->pid = 0;
    }
}

/* Who serves the channel: the init (its children already the sandbox's user), or an image sandbox's
 * command server (`serve-root`), whose children finish what `exec-root` does: host root in every
 * namespace of the sandbox but its user one, which they join (userns), then its filter. */
static struct {
    int userns;
    scmp_filter_ctx filter;
} server = {-1, NULL};

/* In the forked child: what `launcher exec` (the init's: already the sandbox's user with its empty
 * bounding set, no_new_privs, seccomp filter and cgroups) or `exec-root` (a command server's) does
 * last, then the tenant's command. */
static void job_exec(const int fds[CHAN_FDS], int32_t user) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL); /* the server's blocked signals would outlive execve */
    setpgid(0, 0);                          /* a group of its own: a signal reaches all it starts */
    for (int i = 1; i < CHAN_FDS; i++) /* every received descriptor is above 2 (0-2 are /dev/null) */
        if (dup2(fds[i], i - 1) < 0) _exit(EXIT_SETUP);
    struct spec s = parse_spec(fds[0]);
    if (server.userns >= 0) {
        /* Not dumpable (the server's mm is not) until the final execve, as exec-root's child. */
        if (setns(server.userns, CLONE_NEWUSER) != 0) fail("user");
        prefer_for_oom_kill();
        become_inside(server.filter, (uid_t)user, (gid_t)user);
        close_other_fds(); /* the server's listener, connections and user namespace among them */
    } else {
        close_other_fds(); /* the init's listener and connections among them */
        /* Holding nothing of the init's now: dumpable (as execve would make it anyway), which is
         * what lets it write its own /proc files. */
        if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) fail("PR_SET_DUMPABLE");
        prefer_for_oom_kill();
    }
    enter_cwd(&s);
    run_command(&s);
}

static void start_job(int c, uint32_t id, int32_t user, const int fds[CHAN_FDS]) {
    int slot = -1;
    for (int j = 0; j < MAX_JOBS && slot < 0; j++)
        if (jobs[j].pid == 0) slot = j;
    /* A command server's user must be one of the sandbox's ids: (uid_t)-1 would leave host root's. */
    int bad_user = server.userns >= 0 && (user < 0 || user > MAX_USER);
    pid_t pid = slot < 0 || bad_user ? 0 : fork();
    if (pid == 0 && slot >= 0 && !bad_user) job_exec(fds, user);
    if (slot < 0 || bad_user || pid < 0) {
        /* A refusal is not kept: a runtime that lets it find no room loses its connection. */
        if (send_msg(c, CHAN_FAILED, id, slot < 0 ? EAGAIN : bad_user ? EINVAL : errno) == 0) conn_close(c);
        return;
    }
    setpgid(pid, pid); /* as the child does: a signal right after STARTED finds its group */
    jobs[slot] = (struct job){pid, id, c, conns[c].gen, 0, 1};
    flush(c);
}

static void signal_job(int c, uint32_t id, int sig) {
    for (int j = 0; j < MAX_JOBS; j++) {
        struct job *job = &jobs[j];
        if (job->pid > 0 && job->id == id && job_of(job, c)) {
            if (kill(-job->pid, sig) != 0) kill(job->pid, sig);
            return;
        }
    }
}

/* One message from connection c. Anything but a well-formed request ends that connection: whatever
 * sent it is not a runtime that speaks this protocol. Every received descriptor is closed here. */
static void serve_one(int c) {
    struct chan_msg m;
    union {
        char buf[CMSG_SPACE(sizeof(int) * (CHAN_FDS + 4))];
        struct cmsghdr align;
    } control;
    char extra; /* a longer message sets MSG_TRUNC */
    struct iovec iov[2] = {{&m, sizeof m}, {&extra, 1}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    ssize_t n = recvmsg(conns[c].fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    int fds[CHAN_FDS + 4], nfds = 0;
    /* An empty message may carry descriptors too. */
    for (struct cmsghdr *h = n >= 0 ? CMSG_FIRSTHDR(&msg) : NULL; h != NULL; h = CMSG_NXTHDR(&msg, h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
            if (nfds < CHAN_FDS + 4) fds[nfds++] = fd;
            else close(fd);
        }
    }
    int ok = n == (ssize_t)sizeof m && !(msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) && m.magic == CHAN_MAGIC;
    if (ok && m.type == CHAN_EXEC && nfds == CHAN_FDS) {
        start_job(c, m.id, m.value, fds);
    } else if (ok && m.type == CHAN_SIGNAL && nfds == 0 && m.value > 0 && m.value < 65) {
        signal_job(c, m.id, m.value);
    } else {
        conn_close(c);
    }
    for (int i = 0; i < nfds; i++) close(fds[i]);
}

static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int j = 0; j < MAX_JOBS; j++) {
            struct job *job = &jobs[j];
            if (job->pid != pid) continue;
            int c = job->conn;
            job->pid = JOB_EXITED;
            job->code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
            if (conns[c].fd >= 0 && job_of(job, c)) flush(c);
            else job->pid = 0; /* its connection is gone: nobody to tell */
            break;
        }
    }
}

static void accept_one(int *listener) {
    int fd = accept4(*listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
        if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
            close(*listener); /* it cannot serve: the runtime falls back to its launcher */
            *listener = -1;
        }
        return;
    }
    for (int c = 0; c < MAX_CONNS; c++) {
        if (conns[c].fd < 0) {
            conns[c] = (struct conn){fd, ++conn_gen, 0};
            return;
        }
    }
    close(fd); /* every slot taken */
}

/* The serving loop of the init and of a command server: say "ready" on stdout, then hold only
 * /dev/null (and the listener), reap, serve the channel, until a SIGTERM from outside the sandbox. */
static int serve_channel(int listener) {
    sigset_t waited;
    sigemptyset(&waited);
    sigaddset(&waited, SIGCHLD);
    sigaddset(&waited, SIGTERM);
    /* Blocked, then read from a signalfd: a blocked signal is queued even for a pid 1 that has no
     * handler, with its sender, so a SIGTERM is told apart by where it came from. */
    if (sigprocmask(SIG_BLOCK, &waited, NULL) != 0) fail("sigprocmask");
    int sfd = signalfd(-1, &waited, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) fail("signalfd");
    if (listener >= 0) {
        int type = 0;
        socklen_t len = sizeof type;
        if (getsockopt(listener, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET ||
            fcntl(listener, F_SETFD, FD_CLOEXEC) != 0 || fcntl(listener, F_SETFL, O_NONBLOCK) != 0)
            fail_msg("the channel is not a listening seqpacket socket");
    }
    for (int c = 0; c < MAX_CONNS; c++) conns[c].fd = -1;
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0) fail("/dev/null");
    if (write(STDOUT_FILENO, READY, sizeof READY - 1) != (ssize_t)(sizeof READY - 1)) fail("ready");
    /* From here on nothing of the host's is held: stdout and stderr were bubblewrap's pipes to the
     * runtime, which stops reading them once the sandbox is ready. */
    if (dup2(null, STDIN_FILENO) < 0 || dup2(null, STDOUT_FILENO) < 0 || dup2(null, STDERR_FILENO) < 0)
        _exit(EXIT_SETUP);
    close(null);
    for (;;) {
        struct pollfd p[2 + MAX_CONNS];
        int owner[2 + MAX_CONNS], n = 0;
        unsigned gen[2 + MAX_CONNS];
        p[n] = (struct pollfd){sfd, POLLIN, 0};
        owner[n++] = -2;
        if (listener >= 0) {
            p[n] = (struct pollfd){listener, POLLIN, 0};
            owner[n++] = -1;
        }
        for (int c = 0; c < MAX_CONNS; c++) {
            if (conns[c].fd < 0) continue;
            p[n] = (struct pollfd){conns[c].fd, (short)(POLLIN | (conns[c].blocked ? POLLOUT : 0)), 0};
            gen[n] = conns[c].gen;
            owner[n++] = c;
        }
        if (poll(p, (nfds_t)n, -1) < 0) continue;
        for (int i = 0; i < n; i++) {
            if (p[i].revents == 0) continue;
            if (owner[i] == -2) {
                struct signalfd_siginfo info;
                while (read(sfd, &info, sizeof info) == (ssize_t)sizeof info) {
                    /* ssi_pid is 0 for a sender outside our pid namespace: only the host ends the
                     * sandbox this way; a tenant's SIGTERM to pid 1 is read and dropped. */
                    if (info.ssi_signo == SIGTERM && info.ssi_pid == 0) return 0;
                }
                reap();
            } else if (owner[i] == -1) {
                accept_one(&listener);
            } else if (conns[owner[i]].fd >= 0 && conns[owner[i]].gen == gen[i]) { /* not closed since */
                int c = owner[i];
                if (p[i].revents & POLLOUT) {
                    conns[c].blocked = 0;
                    flush(c);
                }
                if (conns[c].fd < 0) continue;
                if (p[i].revents & POLLIN) serve_one(c);
                else if (p[i].revents & (POLLHUP | POLLERR | POLLNVAL))
                    conn_close(c); /* hung up or failed, with nothing left to read */
            }
        }
    }
}

static int init_main(int argc, char **argv) {
    /* Not dumpable: the kernel's ptrace access check then refuses every process without
     * CAP_SYS_PTRACE (none inside has it), though of the same uid: no ptrace, no pidfd_getfd, no
     * /proc/1/fd, environ, mem or root. execve resets the flag, so it is set here, after it. */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) fail("PR_SET_DUMPABLE");
    int listener = -1;
    if (argc == 2 && strcmp(argv[0], "--channel") == 0) listener = (int)parse_id(argv[1], "fd");
    else if (argc != 0) fail_msg("usage: init [--channel FD]");
    close_fds_except(listener);
    return serve_channel(listener);
}

/* ---- serve-root: an image sandbox's command server ---------------------------------------------- */

/* The guest channel for an image's sandbox, whose init cannot serve it (bubblewrap gave it
 * no_new_privs, and every child of it would inherit that: the image's sudo would never work). The
 * host enters the sandbox as `exec-root` does and forks the server into its pid namespace and
 * cgroups, host root still in every namespace but the user one, not dumpable: no process inside has
 * a capability over it (its credentials are the host's), so none can signal, ptrace or read it. It
 * serves the channel as the init does; each command's child finishes what exec-root does (see
 * job_exec). It ends with the sandbox's pid namespace, or on a SIGTERM from the host. */
static int serve_root(int argc, char **argv) {
    if (argc < 3) fail_msg("usage: serve-root INIT_PID PID_NS CHANNEL_FD PROCS...");
    long init = parse_id(argv[0], "pid");
    unsigned long long pid_ns = parse_ns(argv[1]);
    int listener = (int)parse_id(argv[2], "fd");
    if (geteuid() != 0) fail_msg("serve-root runs as root");
    /* Before anything of the sandbox's is entered; the server forked below inherits it. */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) fail("PR_SET_DUMPABLE");
    int null = open("/dev/null", O_RDWR | O_CLOEXEC); /* the host's, for the reaper below */
    if (null < 0) fail("/dev/null");
    server.filter = root_filter();
    int fds[N_NS];
    enter_sandbox(init, pid_ns, argc - 3, argv + 3, fds);
    pid_t child = fork();
    if (child < 0) fail("fork");
    if (child > 0) {
        /* The server's reaper, as exec-root waits for its command: when the sandbox's pid namespace
         * ends, its init's exit waits until every process in it is reaped, the server among them,
         * whose parent is out here. The server says "ready" itself, on the stdout it inherited; ours
         * are let go of, so the runtime reads its answer to the end. */
        if (dup2(null, STDIN_FILENO) < 0 || dup2(null, STDOUT_FILENO) < 0 || dup2(null, STDERR_FILENO) < 0)
            _exit(EXIT_SETUP);
        close(listener); /* the server's alone: a dead server's is refused */
        close(fds[N_NS - 1]);
        int status;
        while (waitpid(child, &status, 0) < 0) {
            if (errno != EINTR) _exit(EXIT_SETUP);
        }
        return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    }
    close(null); /* nothing of the host's in the sandbox */
    /* A session of its own (a signal to the launcher's group is not the server's); the host's paths
     * on its command line are not for the sandbox's eyes (/proc/PID/cmdline is readable to all). */
    if (setsid() < 0) fail("setsid");
    prctl(PR_SET_NAME, "corral-commands", 0, 0, 0);
    for (int i = -2; i < argc; i++) memset(argv[i], 0, strlen(argv[i]));
    server.userns = fds[N_NS - 1];
    return serve_channel(listener);
}

/* ---- fs: the data plane's file operations, run inside the sandbox as its user -------------------- */

/* The sandbox's copy of this binary (the init's) run as a command, in place of a Python helper: the
 * same answers as corral/agent/envd/helper.py, so an image without python3 still has files. Paths
 * arrive hex-encoded (any bytes but NUL, nothing to quote) and are made absolute and normalised
 * lexically, as helper.py does: `..` and symlinks then resolve in the sandbox's own mount namespace,
 * with its user's rights. Answers: JSON on stdout, exit 0 (`read`: a NUL byte, then the bytes);
 * failures: exit 3 and {"code", "message"} on stderr, a Connect code name. A name's bytes are
 * escaped as Python's json.dumps writes the helper's surrogate-escaped strings. */
#define FS_PROTOCOL "corral-fs-1" /* answered to `fs version` (corral/runtime/launcher.py) */
#define FS_EXIT_FAILED 3
#define FS_EXIT_ABANDONED 4
#define FS_CHUNK (64 * 1024)
#define FS_REMOVE_PASSES 8

static void json_text(FILE *out, const char *s, size_t len);

static void fs_fail(const char *code, const char *message) {
    fprintf(stderr, "{\"code\": \"%s\", \"message\": ", code);
    /* As helper.py builds "strerror: filename".rstrip(": "). */
    size_t len = strlen(message);
    while (len > 0 && (message[len - 1] == ':' || message[len - 1] == ' ')) len--;
    json_text(stderr, message, len);
    fputs("}", stderr);
    fflush(stderr);
    _exit(FS_EXIT_FAILED);
}

static const char *fs_code(int err) {
    switch (err) {
    case ENOENT: return "not_found";
    case EEXIST: case ENOTEMPTY: return "already_exists";
    case EACCES: case EPERM: case EROFS: return "permission_denied";
    case ENOSPC: case EDQUOT: return "resource_exhausted";
    default: return "invalid_argument";
    }
}

static char *fs_concat(const char *a, const char *b, const char *c) {
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = malloc(la + lb + lc + 1);
    if (s == NULL) fs_fail("resource_exhausted", "out of memory");
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, c, lc + 1);
    return s;
}

/* An OSError as helper.py reports it: its code by errno, "strerror: filename". */
static void fs_os_fail(int err, const char *filename) {
    fs_fail(fs_code(err), fs_concat(strerror(err), ": ", filename ? filename : ""));
}

/* The next code point of s as Python's surrogateescape decodes it: strict UTF-8, and each byte of an
 * invalid sequence as U+DC80..U+DCFF. */
static uint32_t next_point(const unsigned char *s, size_t len, size_t *i) {
    unsigned char c = s[*i];
    uint32_t cp, min;
    size_t n;
    if (c < 0x80) {
        (*i)++;
        return c;
    }
    if (c >= 0xc2 && c <= 0xdf) n = 1, cp = c & 0x1f, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) n = 2, cp = c & 0x0f, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) n = 3, cp = c & 0x07, min = 0x10000;
    else goto invalid;
    if (*i + n >= len) goto invalid;
    for (size_t k = 1; k <= n; k++) {
        if ((s[*i + k] & 0xc0) != 0x80) goto invalid;
        cp = (cp << 6) | (s[*i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) goto invalid;
    *i += n + 1;
    return cp;
invalid:
    (*i)++;
    return 0xdc00 + c;
}

static void json_text(FILE *out, const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    fputc('"', out);
    for (size_t i = 0; i < len;) {
        uint32_t cp = next_point(s, len, &i);
        if (cp == '"') fputs("\\\"", out);
        else if (cp == '\\') fputs("\\\\", out);
        else if (cp == '\n') fputs("\\n", out);
        else if (cp == '\r') fputs("\\r", out);
        else if (cp == '\t') fputs("\\t", out);
        else if (cp == '\b') fputs("\\b", out);
        else if (cp == '\f') fputs("\\f", out);
        else if (cp >= 0x20 && cp < 0x7f) fputc((int)cp, out);
        else if (cp < 0x10000) fprintf(out, "\\u%04x", (unsigned)cp);
        else {
            cp -= 0x10000;
            fprintf(out, "\\u%04x\\u%04x", (unsigned)(0xd800 + (cp >> 10)), (unsigned)(0xdc00 + (cp & 0x3ff)));
        }
    }
    fputc('"', out);
}

static void json_str(FILE *out, const char *s) { json_text(out, s, strlen(s)); }

/* Names sorted as Python sorts the helper's strings: by code point. */
static int by_point(const void *a, const void *b) {
    const unsigned char *x = *(const unsigned char *const *)a, *y = *(const unsigned char *const *)b;
    size_t lx = strlen((const char *)x), ly = strlen((const char *)y), i = 0, j = 0;
    while (i < lx && j < ly) {
        uint32_t p = next_point(x, lx, &i), q = next_point(y, ly, &j);
        if (p != q) return p < q ? -1 : 1;
    }
    return (i < lx) - (j < ly);
}

/* ---- paths, as posixpath does them ---- */

static char *hex_path(const char *hex) {
    size_t len = strlen(hex);
    if (len == 0 || len % 2) fs_fail("invalid_argument", "path must be a non-empty string");
    char *s = malloc(len / 2 + 1);
    if (s == NULL) fs_fail("resource_exhausted", "out of memory");
    for (size_t i = 0; i < len / 2; i++) {
        unsigned v = 0;
        for (int k = 0; k < 2; k++) {
            char c = hex[2 * i + (size_t)k];
            unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0') : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10) : 16;
            if (d == 16) fs_fail("invalid_argument", "path must be a non-empty string");
            v = v * 16 + d;
        }
        if (v == 0) fs_fail("invalid_argument", "path must be a non-empty string");
        s[i] = (char)v;
    }
    s[len / 2] = '\0';
    return s;
}

/* os.path.expanduser for a path starting with "~". */
static char *expand_user(const char *path) {
    const char *slash = strchr(path + 1, '/');
    size_t end = slash ? (size_t)(slash - path) : strlen(path);
    const char *home = NULL;
    if (end == 1) {
        home = getenv("HOME");
        if (home == NULL) {
            struct passwd *pw = getpwuid(getuid());
            if (pw == NULL) return strdup(path);
            home = pw->pw_dir;
        }
    } else {
        char *name = strndup(path + 1, end - 1);
        struct passwd *pw = name ? getpwnam(name) : NULL;
        free(name);
        if (pw == NULL) return strdup(path);
        home = pw->pw_dir;
    }
    size_t hl = strlen(home);
    while (hl > 0 && home[hl - 1] == '/') hl--;
    char *h = strndup(home, hl);
    if (h == NULL) fs_fail("resource_exhausted", "out of memory");
    char *out = fs_concat(h, path + end, "");
    free(h);
    if (*out == '\0') {
        free(out);
        return strdup("/");
    }
    return out;
}

static char *path_join(const char *a, const char *b) {
    if (b[0] == '/') return fs_concat(b, "", "");
    size_t la = strlen(a);
    return fs_concat(a, la == 0 || a[la - 1] == '/' ? "" : "/", b);
}

/* posixpath.normpath, in place: lexical, "//" alone kept at the start. */
static char *norm_path(char *path) {
    if (*path == '\0') return strcpy(path, ".");
    size_t len = strlen(path);
    int initial = path[0] == '/';
    if (initial && path[1] == '/' && path[2] != '/') initial = 2;
    char *out = malloc(len + 3);
    if (out == NULL) fs_fail("resource_exhausted", "out of memory");
    size_t n = 0, comps = 0;
    for (int k = 0; k < initial; k++) out[n++] = '/';
    size_t base = n;
    for (char *p = path; *p;) {
        while (*p == '/') p++;
        char *e = p;
        while (*e && *e != '/') e++;
        size_t cl = (size_t)(e - p);
        int dot = cl == 1 && p[0] == '.', dotdot = cl == 2 && p[0] == '.' && p[1] == '.';
        int last_dotdot = comps > 0 && n >= base + 2 && out[n - 1] == '.' && out[n - 2] == '.' &&
                          (n == base + 2 || out[n - 3] == '/');
        if (cl == 0 || dot) {
        } else if (!dotdot || (!initial && comps == 0) || last_dotdot) {
            if (comps > 0) out[n++] = '/';
            memcpy(out + n, p, cl);
            n += cl;
            comps++;
        } else if (comps > 0) {
            while (n > base && out[n - 1] != '/') n--;
            if (n > base) n--;
            comps--;
        }
        p = e;
    }
    if (n == 0) out[n++] = '.';
    out[n] = '\0';
    free(path);
    return out;
}

static char *absolute(const char *hex) {
    char *raw = hex_path(hex);
    if (raw[0] == '~') {
        char *e = expand_user(raw);
        free(raw);
        raw = e;
    }
    char *home = expand_user("~");
    char *joined = path_join(home, raw);
    free(home);
    free(raw);
    return norm_path(joined);
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static char *dir_name(const char *path) {
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) + 1 : 0;
    size_t all = 0;
    while (all < n && path[all] == '/') all++;
    if (all != n)
        while (n > 0 && path[n - 1] == '/') n--;
    char *d = strndup(path, n);
    if (d == NULL) fs_fail("resource_exhausted", "out of memory");
    return d;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_link(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* ---- entries ---- */

static void put_owner(FILE *out, int user, unsigned id) {
    static int cached[2] = {0, 0};
    static unsigned ids[2];
    static char names[2][256];
    if (!cached[user] || ids[user] != id) {
        const char *name = NULL;
        if (user) {
            struct passwd *pw = getpwuid(id);
            name = pw ? pw->pw_name : NULL;
        } else {
            struct group *gr = getgrgid(id);
            name = gr ? gr->gr_name : NULL;
        }
        if (name == NULL || strlen(name) >= sizeof names[user]) snprintf(names[user], sizeof names[user], "%u", id);
        else strcpy(names[user], name);
        ids[user] = id;
        cached[user] = 1;
    }
    json_str(out, names[user]);
}

/* stat.filemode */
static void file_mode(char out[11], mode_t m) {
    const char *types = "?pc?d?b?-?l?s???";
    out[0] = types[(m & S_IFMT) >> 12];
    const char *rwx = "rwxrwxrwx";
    for (int i = 0; i < 9; i++) out[1 + i] = (m & (0400 >> i)) ? rwx[i] : '-';
    if (m & S_ISUID) out[3] = (m & S_IXUSR) ? 's' : 'S';
    if (m & S_ISGID) out[6] = (m & S_IXGRP) ? 's' : 'S';
    if (m & S_ISVTX) out[9] = (m & S_IXOTH) ? 't' : 'T';
    out[10] = '\0';
}

static long long round_half_even(double x) {
    long long f = (long long)x;
    if ((double)f > x) f--; /* the floor */
    double rest = x - (double)f;
    return rest > 0.5 || (rest == 0.5 && (f & 1)) ? f + 1 : f;
}

/* datetime.fromtimestamp(st_mtime, UTC).isoformat() with "Z": st_mtime as Python's float, rounded to
 * the microsecond half to even. */
static void put_time(FILE *out, const struct timespec *ts) {
    double t = (double)ts->tv_sec + (double)ts->tv_nsec * 1e-9;
    long long whole = (long long)t; /* modf: toward zero */
    long long us = round_half_even((t - (double)whole) * 1e6);
    if (us >= 1000000) us -= 1000000, whole += 1;
    else if (us < 0) us += 1000000, whole -= 1;
    time_t secs = (time_t)whole;
    struct tm tm;
    if (gmtime_r(&secs, &tm) == NULL) memset(&tm, 0, sizeof tm);
    fprintf(out, "\"%04d-%02d-%02dT%02d:%02d:%02d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
            tm.tm_min, tm.tm_sec);
    if (us) fprintf(out, ".%06lld", us);
    fputs("Z\"", out);
}

/* E2B's entry, as helper.py's entry(): a symlink is reported as what it leads to, with its fully
 * resolved path and isSymlink; one that leads nowhere has no type and itself as its target. */
static void put_entry(FILE *out, const char *path) {
    struct stat info, to;
    if (lstat(path, &info) != 0) fs_os_fail(errno, path);
    const struct stat *mode_of = &info;
    char *target = NULL;
    int link = S_ISLNK(info.st_mode);
    if (link) {
        if (stat(path, &to) == 0) {
            mode_of = &to;
            target = realpath(path, NULL);
        } else {
            mode_of = NULL;
        }
        if (target == NULL) target = fs_concat(path, "", "");
    }
    const char *kind = mode_of == NULL ? "FILE_TYPE_UNSPECIFIED"
                       : S_ISDIR(mode_of->st_mode) ? "FILE_TYPE_DIRECTORY" : "FILE_TYPE_FILE";
    char perms[11];
    file_mode(perms, info.st_mode);
    if (link) perms[0] = 'L'; /* as Go writes a symlink's mode */
    const char *name = base_name(path);
    fputs("{\"name\": ", out);
    json_str(out, *name ? name : "/");
    fprintf(out, ", \"type\": \"%s\", \"path\": ", kind);
    json_str(out, path);
    fprintf(out, ", \"size\": \"%lld\", \"mode\": %u, \"permissions\": \"%s\", \"owner\": ", (long long)info.st_size,
            mode_of ? (unsigned)(mode_of->st_mode & 07777) : 0u, perms);
    put_owner(out, 1, info.st_uid);
    fputs(", \"group\": ", out);
    put_owner(out, 0, info.st_gid);
    fputs(", \"modifiedTime\": ", out);
    put_time(out, &info.st_mtim);
    if (target != NULL) {
        fputs(", \"symlinkTarget\": ", out);
        json_str(out, target);
        fputs(", \"isSymlink\": true", out);
        free(target);
    }
    fputc('}', out);
}

/* ---- list ---- */

struct budget {
    size_t held, limit;
};

static void list_dir(FILE *out, const char *path, long depth, struct budget *b, int *first) {
    DIR *d = opendir(path);
    if (d == NULL) fs_os_fail(errno, path);
    size_t count = 0, cap = 0, held = 0;
    char **names = NULL;
    struct dirent *e;
    for (errno = 0; (e = readdir(d)) != NULL; errno = 0) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        size_t len = strlen(e->d_name) + 1 + sizeof(char *);
        /* Every name is in the answer, so names past the answer's bound are an answer past it. */
        if (b->held + held + len > b->limit) {
            char message[96];
            snprintf(message, sizeof message, "the answer is larger than %zu bytes", b->limit);
            fs_fail("resource_exhausted", message);
        }
        if (count == cap) {
            cap = cap ? cap * 2 : 64;
            names = realloc(names, cap * sizeof *names);
            if (names == NULL) fs_fail("resource_exhausted", "out of memory");
        }
        names[count] = strdup(e->d_name);
        if (names[count++] == NULL) fs_fail("resource_exhausted", "out of memory");
        held += len;
    }
    if (errno != 0) fs_os_fail(errno, path);
    closedir(d);
    qsort(names, count, sizeof *names, by_point);
    b->held += held;
    for (size_t i = 0; i < count; i++) {
        char *child = path_join(path, names[i]);
        if (!*first) fputs(", ", out);
        *first = 0;
        put_entry(out, child);
        if (depth > 1 && is_dir(child) && !is_link(child)) list_dir(out, child, depth - 1, b, first);
        free(child);
        free(names[i]);
    }
    free(names);
    b->held -= held;
}

/* ---- mkdir (os.makedirs) ---- */

/* os.makedirs: 0 made (or there, with exist_ok), else -1 with the errno and the path that failed. A
 * parent that exists already (EEXIST) is no failure of its child's, as in Python. */
static int make_dirs(const char *name, int exist_ok, int *err, char **at) {
    char *head = dir_name(name);
    int tail = *base_name(name) != '\0';
    if (!tail) { /* a trailing slash */
        char *up = dir_name(head);
        tail = *base_name(head) != '\0';
        free(head);
        head = up;
    }
    if (*head && tail && !exists(head) && make_dirs(head, 1, err, at) != 0) {
        if (*err != EEXIST) {
            free(head);
            return -1;
        }
        free(*at);
        *at = NULL;
    }
    free(head);
    if (mkdir(name, 0777) != 0) {
        *err = errno; /* before is_dir's stat changes it */
        if (!exist_ok || !is_dir(name)) {
            *at = fs_concat(name, "", "");
            return -1;
        }
    }
    return 0;
}

static void make_dirs_or_fail(const char *name, int exist_ok) {
    int err = 0;
    char *at = NULL;
    if (make_dirs(name, exist_ok, &err, &at) != 0) fs_os_fail(err, at);
}

/* ---- remove (shutil.rmtree over descriptors: a symlink is removed, never followed) ---- */

static void remove_tree(int parent, const char *name, const char *path) {
    int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) fs_os_fail(errno, path);
    DIR *d = fdopendir(fd);
    if (d == NULL) fs_os_fail(errno, path);
    /* Removed as read, read again until a pass removes nothing: nothing is held per entry. A directory
     * still filling after a few passes fails as rmtree does, on its rmdir (ENOTEMPTY). */
    for (int removed = 1, pass = 0; removed && pass < FS_REMOVE_PASSES; pass++) {
        removed = 0;
        rewinddir(d);
        struct dirent *e;
        for (errno = 0; (e = readdir(d)) != NULL; errno = 0) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char *child = path_join(path, e->d_name);
            struct stat st;
            int dir = e->d_type == DT_DIR ||
                      (e->d_type == DT_UNKNOWN && fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                       S_ISDIR(st.st_mode));
            if (dir) remove_tree(fd, e->d_name, child);
            else if (unlinkat(fd, e->d_name, 0) != 0 && errno != ENOENT) fs_os_fail(errno, child);
            free(child);
            removed = 1;
        }
        if (errno != 0) fs_os_fail(errno, path);
    }
    closedir(d);
    if (unlinkat(parent, name, AT_REMOVEDIR) != 0) fs_os_fail(errno, path);
}

/* ---- move across file systems (shutil.move's copy, then removal) ---- */

static void copy_stat(int fd, const char *path, const struct stat *st) {
    struct timespec times[2] = {st->st_atim, st->st_mtim};
    if (fd >= 0 ? futimens(fd, times) != 0 : utimensat(AT_FDCWD, path, times, 0) != 0) fs_os_fail(errno, path);
    if (fd >= 0 ? fchmod(fd, st->st_mode & 07777) != 0 : chmod(path, st->st_mode & 07777) != 0)
        fs_os_fail(errno, path);
}

/* Everything from in to out: 0, else the errno, *reading saying which side failed. */
static int pump(int in, int out, int *reading) {
    static char buf[FS_CHUNK];
    ssize_t got;
    while ((got = read(in, buf, sizeof buf)) != 0) {
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return *reading = 1, errno;
        for (ssize_t off = 0; off < got;) {
            ssize_t put = write(out, buf + off, (size_t)(got - off));
            if (put < 0 && errno == EINTR) continue;
            if (put < 0) return *reading = 0, errno;
            off += put;
        }
    }
    return 0;
}

static void copy_file(const char *src, const char *dst) {
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) fs_os_fail(errno, src);
    struct stat st;
    if (fstat(in, &st) != 0) fs_os_fail(errno, src);
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (out < 0) fs_os_fail(errno, dst);
    int reading, err = pump(in, out, &reading);
    if (err) fs_os_fail(err, reading ? src : dst);
    copy_stat(out, dst, &st);
    close(out);
    close(in);
}

static void copy_link(const char *src, const char *dst) {
    char target[PATH_MAX + 1];
    ssize_t n = readlink(src, target, PATH_MAX);
    if (n < 0) fs_os_fail(errno, src);
    target[n] = '\0';
    if (symlink(target, dst) != 0) fs_os_fail(errno, dst);
}

static void copy_tree(const char *src, const char *dst) {
    struct stat st;
    if (stat(src, &st) != 0) fs_os_fail(errno, src);
    if (mkdir(dst, 0777) != 0) fs_os_fail(errno, dst);
    DIR *d = opendir(src);
    if (d == NULL) fs_os_fail(errno, src);
    struct dirent *e;
    for (errno = 0; (e = readdir(d)) != NULL; errno = 0) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char *from = path_join(src, e->d_name), *to = path_join(dst, e->d_name);
        if (is_link(from)) copy_link(from, to);
        else if (is_dir(from)) copy_tree(from, to);
        else copy_file(from, to);
        free(from);
        free(to);
    }
    if (errno != 0) fs_os_fail(errno, src);
    closedir(d);
    copy_stat(-1, dst, &st);
}

static void move_across(const char *src, const char *dst) {
    char *real = fs_concat(dst, "", "");
    if (is_dir(dst)) {
        free(real);
        real = path_join(dst, base_name(src));
        if (exists(real)) fs_fail("already_exists", fs_concat("Destination path '", real, "' already exists"));
    }
    if (is_link(src)) {
        copy_link(src, real);
        if (unlink(src) != 0) fs_os_fail(errno, src);
    } else if (is_dir(src)) {
        size_t ls = strlen(src);
        if (strncmp(real, src, ls) == 0 && (real[ls] == '/' || real[ls] == '\0'))
            fs_fail("invalid_argument", fs_concat("Cannot move a directory '", src, "' into itself"));
        copy_tree(src, real);
        remove_tree(AT_FDCWD, src, src);
    } else {
        copy_file(src, real);
        if (unlink(src) != 0) fs_os_fail(errno, src);
    }
    free(real);
}

/* ---- read and write ---- */

static int fs_read(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) fs_os_fail(errno, path);
    struct stat st;
    if (fstat(fd, &st) != 0) fs_os_fail(errno, path);
    if (S_ISDIR(st.st_mode)) fs_os_fail(EISDIR, path); /* as Python's open() refuses one */
    /* Once the answer has begun, a failure is its end cut short (or its reader gone). */
    int reading;
    if (write(STDOUT_FILENO, "", 1) != 1 || pump(fd, STDOUT_FILENO, &reading) != 0) _exit(FS_EXIT_FAILED);
    return 0;
}

static char partial[PATH_MAX + 64]; /* the file a write is making, removed by the signal's handler */

/* An upload cut short (too big, stalled, the caller gone: the agent sends SIGTERM) leaves nothing. */
static void abandon(int sig) {
    (void)sig;
    unlink(partial);
    _exit(FS_EXIT_ABANDONED);
}

static void fs_write_fail(int err, const char *filename) {
    unlink(partial);
    fs_os_fail(err, filename);
}

static int fs_write(FILE *out, const char *path) {
    if (is_dir(path)) fs_fail("invalid_argument", fs_concat(path, " is a directory", ""));
    char *dir = dir_name(path);
    make_dirs_or_fail(dir, 1);
    size_t dl = strlen(dir);
    int n = snprintf(partial, sizeof partial, "%s%s.%s.%d.partial", dir, dl && dir[dl - 1] != '/' ? "/" : "",
                     base_name(path), (int)getpid());
    if (n < 0 || (size_t)n >= sizeof partial) fs_os_fail(ENAMETOOLONG, path);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = abandon;
    if (sigaction(SIGTERM, &sa, NULL) != 0) fs_os_fail(errno, NULL);
    /* Never through a symlink planted at its name. */
    int fd = open(partial, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0) fs_os_fail(errno, partial);
    int reading, err = pump(STDIN_FILENO, fd, &reading);
    if (err) fs_write_fail(err, NULL);
    if (close(fd) != 0) fs_write_fail(errno, NULL);
    if (rename(partial, path) != 0) fs_write_fail(errno, partial);
    fputs("[{\"name\": ", out);
    json_str(out, base_name(path));
    fputs(", \"type\": \"file\", \"path\": ", out);
    json_str(out, path);
    fputs("}]", out);
    return 0;
}

/* ---- watch (inotify): as helper.py's watch(), a JSON line per event until killed ---- */

#define WATCHED (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF)
#define MAX_WATCHES 4096 /* directories one recursive watch follows; past it, deeper ones go unwatched */

static const struct {
    uint32_t bits;
    const char *kind;
} EVENT_TYPES[] = {
    {IN_CREATE | IN_MOVED_TO, "EVENT_TYPE_CREATE"},
    {IN_MODIFY, "EVENT_TYPE_WRITE"},
    {IN_DELETE | IN_DELETE_SELF, "EVENT_TYPE_REMOVE"},
    {IN_MOVED_FROM | IN_MOVE_SELF, "EVENT_TYPE_RENAME"},
    {IN_ATTRIB, "EVENT_TYPE_CHMOD"},
};

/* Each watch descriptor and its directory, relative to the watched path. */
struct watches {
    int fd, recursive, count;
    const char *root;
    int wd[MAX_WATCHES];
    char *name[MAX_WATCHES];
};

static const char *watched_name(const struct watches *w, int wd) {
    for (int i = w->count - 1; i >= 0; i--)
        if (w->wd[i] == wd) return w->name[i];
    return NULL;
}

/* Watch `first` (relative to the root) and, recursively, every directory under it, depth first from
 * a stack of at most MAX_WATCHES names: nothing grows with the tree beyond the watches' own bound. */
static void watch_add(struct watches *w, const char *first) {
    char *pending[MAX_WATCHES];
    int n = 0;
    pending[n++] = fs_concat(first, "", "");
    while (n > 0 && w->count < MAX_WATCHES) {
        char *relative = pending[--n];
        char *target = *relative ? path_join(w->root, relative) : fs_concat(w->root, "", "");
        int wd = inotify_add_watch(w->fd, target, WATCHED | IN_ONLYDIR);
        if (wd < 0) {
            if (!*relative) fs_os_fail(errno, w->root);
            free(relative); /* a subdirectory gone or unreadable meanwhile: not the watch's failure */
            free(target);
            continue;
        }
        int slot = -1;
        for (int i = 0; i < w->count && slot < 0; i++) /* the same directory again: its name now */
            if (w->wd[i] == wd) slot = i;
        if (slot < 0) slot = w->count++;
        else free(w->name[slot]);
        w->wd[slot] = wd;
        w->name[slot] = relative;
        DIR *d = w->recursive ? opendir(target) : NULL;
        struct dirent *e;
        while (d != NULL && (e = readdir(d)) != NULL && n < MAX_WATCHES) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            struct stat st;
            int dir = e->d_type == DT_DIR ||
                      (e->d_type == DT_UNKNOWN && fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                       S_ISDIR(st.st_mode));
            if (dir) pending[n++] = path_join(relative, e->d_name);
        }
        if (d != NULL) closedir(d);
        free(target);
    }
    while (n > 0) free(pending[--n]);
}

static void put_event(FILE *out, const char *name, const char *kind) {
    fputs("{\"name\": ", out);
    json_str(out, name);
    fprintf(out, ", \"type\": \"%s\"}\n", kind);
}

static int fs_watch(FILE *out, const char *path, int recursive) {
    if (!is_dir(path)) {
        if (exists(path)) fs_fail("invalid_argument", fs_concat("path ", path, " is not a directory"));
        fs_fail("not_found", fs_concat("no such directory: ", path, ""));
    }
    static struct watches w;
    w.fd = inotify_init1(IN_CLOEXEC);
    if (w.fd < 0) fs_os_fail(errno, NULL);
    w.recursive = recursive;
    w.root = path;
    watch_add(&w, "");
    fputs("{\"start\": ", out);
    json_str(out, path);
    fputs("}\n", out);
    if (fflush(out) != 0) return FS_EXIT_FAILED;
    /* A reader that falls behind blocks these writes; the kernel's own bounded queue then drops
     * events (inotify's overflow), so nothing here grows with a flood. */
    static char buf[FS_CHUNK] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t got = read(w.fd, buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) fs_os_fail(got < 0 ? errno : EIO, NULL);
        for (ssize_t off = 0; off + (ssize_t)sizeof(struct inotify_event) <= got;) {
            const struct inotify_event *ev = (const struct inotify_event *)(buf + off);
            off += (ssize_t)(sizeof *ev + ev->len);
            const char *dir = watched_name(&w, ev->wd);
            if (ev->mask & (IN_Q_OVERFLOW | IN_IGNORED) || dir == NULL) continue;
            size_t len = strnlen(ev->name, ev->len);
            char *raw = strndup(ev->name, len);
            if (raw == NULL) fs_fail("resource_exhausted", "out of memory");
            char *name = len ? path_join(dir, raw) : fs_concat(dir, "", "");
            if (recursive && ev->mask & IN_ISDIR && ev->mask & (IN_CREATE | IN_MOVED_TO)) watch_add(&w, name);
            for (size_t k = 0; k < sizeof EVENT_TYPES / sizeof *EVENT_TYPES; k++)
                if (ev->mask & EVENT_TYPES[k].bits) put_event(out, name, EVENT_TYPES[k].kind);
            free(raw);
            free(name);
        }
        if (fflush(out) != 0) return FS_EXIT_FAILED; /* the reader is gone */
    }
}

static long fs_number(const char *text, long most) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < 1 || v > most) fs_fail("invalid_argument", "bad number in the request");
    return v;
}

static int fs_main(int argc, char **argv) {
    if (argc == 1 && strcmp(argv[0], "version") == 0) return puts(FS_PROTOCOL) >= 0 && fflush(stdout) == 0 ? 0 : 1;
    if (argc < 2) fs_fail("invalid_argument", "usage: fs OP PATH... | fs version");
    const char *op = argv[0];
    FILE *out = stdout;
    static char buffer[FS_CHUNK];
    setvbuf(out, buffer, _IOFBF, sizeof buffer);
    char *path = absolute(argv[1]);
    if (strcmp(op, "stat") == 0 && argc == 2) {
        fputs("{\"entry\": ", out);
        put_entry(out, path);
        fputs("}", out);
    } else if (strcmp(op, "list") == 0 && argc == 4) {
        long depth = fs_number(argv[2], 1L << 30);
        struct budget b = {0, (size_t)fs_number(argv[3], 1L << 30)};
        if (!is_dir(path)) {
            if (exists(path)) fs_fail("invalid_argument", fs_concat(path, " is not a directory", ""));
            fs_fail("not_found", fs_concat("no such directory: ", path, ""));
        }
        int first = 1;
        fputs("{\"entries\": [", out);
        list_dir(out, path, depth, &b, &first);
        fputs("]}", out);
    } else if (strcmp(op, "mkdir") == 0 && argc == 2) {
        make_dirs_or_fail(path, 0);
        fputs("{\"entry\": ", out);
        put_entry(out, path);
        fputs("}", out);
    } else if (strcmp(op, "move") == 0 && argc == 3) {
        char *destination = absolute(argv[2]);
        char *parent = dir_name(destination);
        make_dirs_or_fail(parent, 1);
        if (rename(path, destination) != 0) {
            if (errno != EXDEV) fs_os_fail(errno, path);
            move_across(path, destination); /* another file system (home and /tmp are apart) */
        }
        fputs("{\"entry\": ", out);
        put_entry(out, destination);
        fputs("}", out);
    } else if (strcmp(op, "remove") == 0 && argc == 2) {
        /* As E2B's (Go's RemoveAll): a path that does not exist is already removed. */
        if (is_dir(path) && !is_link(path)) remove_tree(AT_FDCWD, path, path);
        else if (unlink(path) != 0 && errno != ENOENT) fs_os_fail(errno, path);
        fputs("{}", out);
    } else if (strcmp(op, "read") == 0 && argc == 2) {
        return fs_read(path);
    } else if (strcmp(op, "write") == 0 && argc == 2) {
        fs_write(out, path);
    } else if (strcmp(op, "watch") == 0 && argc == 3 && (strcmp(argv[2], "0") == 0 || strcmp(argv[2], "1") == 0)) {
        return fs_watch(out, path, argv[2][0] == '1');
    } else {
        fs_fail("invalid_argument", "unknown operation");
    }
    return fflush(out) == 0 ? 0 : FS_EXIT_FAILED;
}

int main(int argc, char **argv) {
    if (argc < 2) fail_msg("usage: launcher seccomp | init | spawn ... | exec[-root] ... | serve-root ... | disk ... | rootfs ... | allow-suid ... | check-spec | fs ...");
    const char *mode = argv[1];
    if (strcmp(mode, "seccomp") == 0) {
        scmp_filter_ctx ctx = build_filter();
        int rc = seccomp_export_bpf(ctx, 1);
        seccomp_release(ctx);
        return rc == 0 ? 0 : EXIT_SETUP;
    }
    if (strcmp(mode, "init") == 0) return init_main(argc - 2, argv + 2);
    if (strcmp(mode, "spawn") == 0) return spawn(argc - 2, argv + 2);
    if (strcmp(mode, "exec") == 0) return exec_in(argc - 2, argv + 2, 0);
    if (strcmp(mode, "exec-root") == 0) return exec_in(argc - 2, argv + 2, 1);
    if (strcmp(mode, "serve-root") == 0) return serve_root(argc - 2, argv + 2);
    if (strcmp(mode, "disk") == 0) return disk(argc - 2, argv + 2);
    if (strcmp(mode, "rootfs") == 0) return rootfs(argc - 2, argv + 2);
    if (strcmp(mode, "allow-suid") == 0) return allow_suid(argc - 2, argv + 2);
    if (strcmp(mode, "check-spec") == 0) return check_spec();
    if (strcmp(mode, "fs") == 0) return fs_main(argc - 2, argv + 2);
    fail_msg("unknown mode");
    return EXIT_SETUP;
}
