/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * A sandbox, from start to end:
 *
 *   caller                 snapshot, cgroup, FUSE server, then waits
 *   ├─ server              serves the snapshot; in the sandbox's I/O cgroup
 *   └─ outer               joins the cgroup, unshares the namespaces
 *      └─ init (PID 1)     mounts, hostname, loopback; reaps, passes signals on
 *         └─ task          confined, then exec
 *
 * Setup failures in the children come back to the caller over a pipe
 * that exec closes, as "ERRNO message".
 */

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "alloc-util.h"
#include "cleanup.h"
#include "fd-util.h"
#include "runtime-internal.h"
#include "string-util.h"

#define SERVER_READY_TIMEOUT_MS (30 * 1000)

/* What init passes on to the task, and the outer child to init. Each of
 * them keeps these blocked from its fork until its handler that passes
 * them on knows where to: one that comes meanwhile waits, never lost. */
static const int forwarded_signals[] = { SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 };

static sigset_t forwarded_set(void) {
        sigset_t set;

        sigemptyset(&set);
        for (size_t i = 0; i < ELEMENTSOF(forwarded_signals); i++)
                sigaddset(&set, forwarded_signals[i]);
        return set;
}

static const char *const default_env[] = {
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/",
        "container=cowbox",
        NULL,
};

/* ---- in the children ---- */

_printf_(3, 4) _noreturn_
static void child_fail(int fd, int error, const char *format, ...) {
        char text[512];
        va_list ap;

        va_start(ap, format);
        vsnprintf(text, sizeof text, format, ap);
        va_end(ap);
        dprintf(fd, "%d %s\n", error, text);
        _exit(127);
}

static int mkdir_p(const char *path, mode_t mode) {
        char buf[4096];

        snprintf(buf, sizeof buf, "%s", path);
        for (char *p = buf + 1; *p; p++)
                if (*p == '/') {
                        *p = 0;
                        if (mkdir(buf, mode) < 0 && errno != EEXIST)
                                return -errno;
                        *p = '/';
                }
        return mkdir(buf, mode) < 0 && errno != EEXIST ? -errno : 0;
}

/* Whether a component of path past its first skip bytes is a symbolic
 * link. */
static bool path_has_symlink(const char *path, size_t skip) {
        char buf[4096];
        struct stat st;

        snprintf(buf, sizeof buf, "%s", path);
        for (char *p = buf + skip + 1;; p++) {
                bool end = *p == 0;

                if (*p != '/' && !end)
                        continue;
                *p = 0;
                if (lstat(buf, &st) < 0)
                        return false;   /* what does not exist yet is made, as a directory */
                if (S_ISLNK(st.st_mode))
                        return true;
                if (end)
                        return false;
                *p = '/';
        }
}

/* A minimal /dev: a tmpfs with the host's harmless nodes bound in. */
static int make_dev(const char *root) {
        static const char *const nodes[] = { "null", "zero", "full", "random", "urandom", "tty" };
        char path[4096], src[64];

        snprintf(path, sizeof path, "%s/dev", root);
        /* nodev: a node the task makes (it keeps CAP_MKNOD, as package
         * installs need) opens nothing; the nodes bound in keep their own
         * mounts' flags. */
        if (mkdir_p(path, 0755) < 0 ||
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NOEXEC | MS_NODEV, "mode=755,size=64k") < 0)
                return -errno;
        for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
                int fd;

                snprintf(path, sizeof path, "%s/dev/%s", root, nodes[i]);
                snprintf(src, sizeof src, "/dev/%s", nodes[i]);
                fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
                if (fd < 0)
                        return -errno;
                close(fd);
                if (mount(src, path, NULL, MS_BIND, NULL) < 0)
                        return -errno;
        }
        snprintf(path, sizeof path, "%s/dev/shm", root);
        if (mkdir(path, 01777) < 0 || mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") < 0)
                return -errno;
        snprintf(path, sizeof path, "%s/dev/fd", root);
        if (symlink("/proc/self/fd", path) < 0)
                return -errno;
        return 0;
}

static int make_proc_tmp(const char *root) {
        char path[4096];

        snprintf(path, sizeof path, "%s/proc", root);
        if (mkdir_p(path, 0555) < 0 || mount("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
                return -errno;
        /* The host's knobs in /proc are the host's: root in a sandbox
         * without a user namespace could write kernel.core_pattern, and
         * run a program of its own as the host's root. Read-only, as
         * container engines leave them. */
        FOREACH_STRING(knob, "sys", "sysrq-trigger", "irq", "bus", "fs") {
                snprintf(path, sizeof path, "%s/proc/%s", root, knob);
                if (access(path, F_OK) < 0)
                        continue;
                if (mount(path, path, NULL, MS_BIND | MS_REC, NULL) < 0 ||
                    mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                          NULL) < 0)
                        return -errno;
        }
        /* What tells of the host's kernel and hardware is masked, as
         * container engines mask it: files by /dev/null, directories by an
         * empty tmpfs. The kpage* files, which root reads without any
         * other capability, map the host's physical memory: the flags, use
         * counts and memory cgroups of every page. */
        FOREACH_STRING(masked, "kcore", "keys", "key-users", "timer_list", "sched_debug", "latency_stats",
                       "kpageflags", "kpagecount", "kpagecgroup", "acpi", "asound", "scsi") {
                struct stat st;

                snprintf(path, sizeof path, "%s/proc/%s", root, masked);
                if (lstat(path, &st) < 0)
                        continue;
                if (S_ISDIR(st.st_mode) ? mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                                                "size=4k,mode=555") < 0
                                        : mount("/dev/null", path, NULL, MS_BIND, NULL) < 0)
                        return -errno;
        }
        snprintf(path, sizeof path, "%s/tmp", root);
        if (mkdir_p(path, 01777) < 0 || mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") < 0)
                return -errno;
        return 0;
}

/* A workdir sandbox's own /run, in place of the host's and its sockets;
 * the resolver's configuration, which /etc/resolv.conf often points to
 * there, is bound in. */
static int make_run(const char *root) {
        char path[4096], resolv[PATH_MAX];

        snprintf(path, sizeof path, "%s/run", root);
        if (access(path, F_OK) < 0)
                return 0;
        if (mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=16m") < 0)
                return -errno;
        if (realpath("/etc/resolv.conf", resolv) && startswith(resolv, "/run/")) {
                int fd;

                snprintf(path, sizeof path, "%s%s", root, resolv);
                *strrchr(path, '/') = 0;
                if (mkdir_p(path, 0755) < 0)
                        return -errno;
                snprintf(path, sizeof path, "%s%s", root, resolv);
                fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
                if (fd < 0)
                        return -errno;
                close(fd);
                if (mount(resolv, path, NULL, MS_BIND, NULL) < 0 ||
                    mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
                        return -errno;
        }
        return 0;
}

/* An empty read-only tmpfs over path. */
static int cover(const char *path) {
        return mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=755") < 0 ?
                -errno : 0;
}

/* Hides a host directory from a workdir sandbox (the store, the other
 * sandboxes). */
static void hide(const char *root, const char *dir) {
        char path[4096];

        snprintf(path, sizeof path, "%s%s", root, dir);
        (void) cover(path);
}

/* Detaches from a workdir sandbox's view of the host every mount of a
 * store's subvolume: workspaces, the snapshots of other sandboxes, those of
 * other stores. Their files are the store's, hidden as the store is (a
 * workspace is its developer's alone, and the task is root). Before any
 * mount of the sandbox's own covers one of them. */
static int hide_subvolume_mounts(const char *root) {
        _cleanup_strv_free_ char **found = NULL;
        size_t n = 0, allocated = 0, len = strlen(root);

        {
                _cleanup_fclose_ FILE *f = fopen("/proc/self/mountinfo", "re");
                char line[8192];

                if (!f)
                        return -errno;
                while (fgets(line, sizeof line, f)) {
                        char mountpoint[4096], fstype[256], source[256];
                        const char *dash = strstr(line, " - ");

                        if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", mountpoint) != 1 ||
                            sscanf(dash + 3, "%255s %255s", fstype, source) != 2 ||
                            (!streq(fstype, "fuse.cowbox") && !startswith(source, "cowbox:")))
                                continue;
                        mountinfo_unescape(mountpoint);
                        if (strncmp(mountpoint, root, len) != 0 || (mountpoint[len] != '/' && mountpoint[len]))
                                continue;
                        if (!GREEDY_REALLOC(found, allocated, n + 2))
                                return -ENOMEM;
                        found[n] = strdup(mountpoint);
                        if (!found[n])
                                return -ENOMEM;
                        found[++n] = NULL;
                }
        }
        /* The last first: one stacked on another, or mounted inside it. A
         * mount already gone with the one it was in, or covered on the
         * host by another, is out of reach already. In a user namespace
         * the host's mounts are locked to it (EINVAL): covered instead.
         * One in a directory the namespace's root may not pass through
         * (EACCES) may still be reached by another of its users: the run
         * fails rather than leave it, unless it is another sandbox's,
         * whose directory is root's and shut to all but its own
         * namespace. */
        while (n > 0) {
                const char *m = found[--n];
                int r;

                if (umount2(m, MNT_DETACH | UMOUNT_NOFOLLOW) >= 0 || errno == ENOENT)
                        continue;
                if (errno == EACCES && strstr(m + len, "-sandboxes/") && endswith(m, "/root"))
                        continue;
                if (errno != EINVAL)
                        return -errno;
                r = cover(m);
                if (r < 0 && r != -ENOENT && r != -ENOTDIR)
                        return r;
        }
        return 0;
}

typedef struct Plan {
        const SandboxOptions *opts;
        const char *mountpoint;         /* the snapshot, served on the host */
        const char *staging;            /* the workdir shape's new root */
        const char *store_path;
        const char *sandboxes_dir;
        int error_fd;
} Plan;

static void setup_mounts(const Plan *p) {
        const char *root;
        int r;

        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
                child_fail(p->error_fd, errno, "cannot make the mounts private: %m");

        if (p->opts->shape == SANDBOX_ROOT) {
                root = p->mountpoint;
                if (mount(root, root, NULL, MS_BIND | MS_REC, NULL) < 0)
                        child_fail(p->error_fd, errno, "cannot bind the snapshot: %m");
        } else {
                /* Read-only is not enough: a device node of the host's
                 * opens as well on a read-only mount. */
                struct mount_attr attr = {
                        .attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID,
                };

                root = p->staging;
                if (mount("/", root, NULL, MS_BIND | MS_REC, NULL) < 0 ||
                    syscall(SYS_mount_setattr, AT_FDCWD, root, AT_RECURSIVE, &attr, sizeof attr) < 0)
                        child_fail(p->error_fd, errno, "cannot make the host read-only: %m");
                r = hide_subvolume_mounts(root);
                if (r < 0)
                        child_fail(p->error_fd, -r, "cannot hide the mounts of the store's subvolumes: %s%s",
                                   strerror(-r), r == -EACCES ? " (one is in a directory the user namespace's "
                                   "root may not pass through: mount it elsewhere, or run without one)" : "");
                hide(root, p->store_path);
                hide(root, p->sandboxes_dir);
                /* Nor does it keep a task from the host's daemons: their
                 * sockets (the system bus, systemd, container engines)
                 * connect as well. /run gets a tmpfs of its own. */
                if (make_run(root) < 0)
                        child_fail(p->error_fd, errno, "cannot mount /run: %m");
        }
        /* Looked up before the root changes, the image's symbolic links
         * would lead to the host's directories. */
        if (p->opts->shape == SANDBOX_ROOT)
                FOREACH_STRING(dir, "/proc", "/dev", "/tmp") {
                        char path[4096];

                        snprintf(path, sizeof path, "%s%s", root, dir);
                        if (path_has_symlink(path, strlen(root)))
                                child_fail(p->error_fd, ELOOP, "the image's %s is a symbolic link: the sandbox "
                                           "mounts its own there", dir);
                }
        if (make_proc_tmp(root) < 0)
                child_fail(p->error_fd, errno, "cannot mount /proc and /tmp: %m");
        if (make_dev(root) < 0)
                child_fail(p->error_fd, errno, "cannot make /dev: %m");
        if (p->opts->shape == SANDBOX_WORKDIR) {
                char target[4096];

                /* Under the private /tmp, the path is made; elsewhere the
                 * read-only host must have it. */
                snprintf(target, sizeof target, "%s%s", root, p->opts->workdir);
                /* Looked up before the root changes, a symbolic link would
                 * lead to the host's directories, writable: none is taken. */
                if (path_has_symlink(target, strlen(root)))
                        child_fail(p->error_fd, ELOOP, "the working tree's path %s goes through a symbolic link",
                                   p->opts->workdir);
                (void) mkdir_p(target, 0755);
                if (mount(p->mountpoint, target, NULL, MS_BIND, NULL) < 0)
                        child_fail(p->error_fd, errno, "cannot mount the snapshot at %s (it must be a directory "
                                   "of the host, or under /tmp): %m", p->opts->workdir);
        }

        /* The new root, with the old one stacked under it and detached. */
        if (chdir(root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 ||
            chdir("/") < 0)
                child_fail(p->error_fd, errno, "cannot switch to the sandbox's root: %m");
}

static void loopback_up(void) {
        struct ifreq ifr = {};
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

        if (fd < 0)
                return;
        snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
        if (ioctl(fd, SIOCGIFFLAGS, &ifr) >= 0) {
                ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
                (void) ioctl(fd, SIOCSIFFLAGS, &ifr);
        }
        close(fd);
}

static void redirect(const Plan *p, const char *path, int fd) {
        int out;

        if (!path)
                return;
        out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0640);
        if (out < 0 || dup2(out, fd) < 0)
                child_fail(p->error_fd, errno, "cannot open %s: %m", path);
        close(out);
}

_noreturn_
static void task_main(const Plan *p) {
        const SandboxOptions *o = p->opts;
        int r;

        const char *cwd = o->cwd ? o->cwd : o->shape == SANDBOX_WORKDIR ? o->workdir : "/";

        if (chdir(cwd) < 0)
                child_fail(p->error_fd, errno, "cannot change to the working directory %s: %m", cwd);
        r = confine_task(o);
        if (r < 0)
                child_fail(p->error_fd, -r, "cannot confine the task: %s", strerror(-r));
        if (o->gid != 0 || o->uid != 0) {
                if (setgroups(0, NULL) < 0 || setresgid(o->gid, o->gid, o->gid) < 0 ||
                    setresuid(o->uid, o->uid, o->uid) < 0)
                        child_fail(p->error_fd, errno, "cannot become user %u: %m", (unsigned) o->uid);
        }
        (void) signal(SIGPIPE, SIG_DFL);
        /* execvpe() searches the PATH of the caller's environment: the
         * task's is the one to search. */
        {
                char *const *env = o->envp ? o->envp : (char *const *) default_env;
                const char *path = NULL;

                for (char *const *e = env; *e; e++)
                        if (startswith(*e, "PATH="))
                                path = *e + 5;
                if (path ? setenv("PATH", path, 1) < 0 : unsetenv("PATH") < 0)
                        child_fail(p->error_fd, errno, "cannot set the task's PATH: %m");
                execvpe(o->argv[0], o->argv, env);
        }
        child_fail(p->error_fd, errno, "cannot run %s: %m", o->argv[0]);
}

static pid_t init_task;

/* In init: to the task; in the outer child: to init. */
static void init_forward(int sig) {
        if (init_task > 0)
                (void) kill(init_task, sig);
}

/* PID 1 of the sandbox: reaps every orphan, passes signals on to the task,
 * and ends with it (the kernel then kills what is left). */
_noreturn_
static void init_main(const Plan *p) {
        const int *forwarded = forwarded_signals;
        const char *hostname = p->opts->hostname ? p->opts->hostname : p->opts->name;
        /* A hostname made from a long snapshot name is cut to what fits. */
        size_t hostname_len = strnlen(hostname, HOST_NAME_MAX);
        int status;
        pid_t pid;

        /* If the sandbox's starter dies, everything in it goes too. */
        (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
        /* Nothing of the caller's or the store's reaches the task: a
         * directory left open is a way out of any root. Only the pipe for
         * errors stays, until the task runs. */
        if ((p->error_fd > 3 && close_range(3, (unsigned) p->error_fd - 1, 0) < 0) ||
            close_range((unsigned) p->error_fd + 1, ~0U, 0) < 0)
                child_fail(p->error_fd, errno, "cannot close the descriptors it inherited: %m");
        setup_mounts(p);
        if (sethostname(hostname, hostname_len) < 0)
                child_fail(p->error_fd, errno, "cannot set the hostname: %m");
        if (!p->opts->host_network)
                loopback_up();

        for (size_t i = 0; i < ELEMENTSOF(forwarded_signals); i++)
                (void) signal(forwarded[i], init_forward);
        init_task = fork();
        if (init_task < 0)
                child_fail(p->error_fd, errno, "cannot start the task: %m");
        if (init_task == 0) {
                sigset_t none;

                for (size_t i = 0; i < ELEMENTSOF(forwarded_signals); i++)
                        (void) signal(forwarded[i], SIG_DFL);
                sigemptyset(&none);
                (void) sigprocmask(SIG_SETMASK, &none, NULL);
                task_main(p);
        }
        {
                sigset_t set = forwarded_set();

                (void) sigprocmask(SIG_UNBLOCK, &set, NULL);
        }
        for (;;) {
                pid = waitpid(-1, &status, 0);
                if (pid < 0 && errno == EINTR)
                        continue;
                if (pid < 0)
                        _exit(127);
                if (pid == init_task) {
                        /* An exit status cannot tell "exit 130" from "killed
                         * by SIGINT": the caller gets the task's own. */
                        dprintf(p->error_fd, "status %d\n", status);
                        _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
                }
        }
}

/* ---- in the caller ---- */

/* Lets ID owner, alone, pass through the directory of fd, which is root's:
 * an ACL entry (user:OWNER:--x), where the file system has ACLs, rather
 * than the group owner, which would let the members of a host group of
 * that ID in too. In the kernel's form of an ACL, little-endian. */
static int grant_passage(int fd, uid_t owner) {
        static const struct { uint16_t tag, perm; } entries[] = {
                { 0x01, 7 },    /* user:: rwx */
                { 0x02, 1 },    /* user:OWNER: --x */
                { 0x04, 0 },    /* group:: --- */
                { 0x10, 1 },    /* mask:: --x */
                { 0x20, 0 },    /* other:: --- */
        };
        uint8_t acl[4 + 8 * ELEMENTSOF(entries)] = { 2, 0, 0, 0 };

        for (size_t i = 0; i < ELEMENTSOF(entries); i++) {
                uint8_t *e = acl + 4 + 8 * i;
                uint32_t id = entries[i].tag == 0x02 ? (uint32_t) owner : UINT32_MAX;

                e[0] = (uint8_t) entries[i].tag;
                e[1] = (uint8_t) (entries[i].tag >> 8);
                e[2] = (uint8_t) entries[i].perm;
                e[3] = 0;
                for (unsigned b = 0; b < 4; b++)
                        e[4 + b] = (uint8_t) (id >> (8 * b));
        }
        if (fsetxattr(fd, "system.posix_acl_access", acl, sizeof acl, 0) >= 0)
                return 0;
        if (errno != EOPNOTSUPP)
                return -errno;
        return fchown(fd, 0, (gid_t) owner) < 0 || fchmod(fd, 0710) < 0 ? -errno : 0;
}

/* The sandbox's directory and its mount points, root's alone to change. A
 * user namespace's root (the host's BASE) may only pass through it: were
 * the directory theirs, a user of that ID on the host could put a
 * symbolic link where the snapshot is mounted, by root, and have it
 * mounted over /etc. One left by an earlier run (a crash, or a version
 * that gave the directory to BASE) is taken back first, through its
 * descriptor; one that is not root's own directory on the disk of the
 * sandboxes' (a mount there), or a mount point in it that root did not
 * make or that something is mounted on, is refused. */
static int make_own_dirs(const char *sandboxes, const char *own_dir, const char *const *mountpoints, uid_t owner) {
        _cleanup_close_ int fd = -EBADF;
        struct stat parent, st;

        if (mkdir(sandboxes, 0755) < 0 && errno != EEXIST)
                return -errno;
        if (lstat(sandboxes, &parent) < 0)
                return -errno;
        if (mkdir(own_dir, 0700) < 0 && errno != EEXIST)
                return -errno;
        fd = open(own_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return errno == ENOTDIR || errno == ELOOP ? -ELOOP : -errno;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (st.st_dev != parent.st_dev)
                return -ELOOP;
        if (fchown(fd, 0, 0) < 0 || fchmod(fd, 0700) < 0)
                return -errno;
        if (owner != 0) {
                int r = grant_passage(fd, owner);
                if (r < 0)
                        return r;
        } else if (fremovexattr(fd, "system.posix_acl_access") < 0 && errno != ENODATA && errno != EOPNOTSUPP)
                return -errno;
        for (const char *const *m = mountpoints; *m; m++) {
                const char *base = strrchr(*m, '/') + 1;

                if (mkdirat(fd, base, 0755) < 0 && errno != EEXIST)
                        return -errno;
                if (fstatat(fd, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        return -errno;
                if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || st.st_dev != parent.st_dev)
                        return -ELOOP;
        }
        return 0;
}

/* Starts the FUSE server of the snapshot in the sandbox's I/O cgroup. */
static int start_server(Store *s, const char *name, const char *mountpoint, const Cgroup *cg,
                        uid_t userns_base, pid_t *ret) {
        _cleanup_close_ int rfd = -EBADF;
        int fds[2], r;
        char buf[4];
        pid_t pid, caller;

        if (pipe2(fds, O_CLOEXEC) < 0)
                return -errno;
        rfd = fds[0];
        caller = getpid();
        pid = fork();
        if (pid < 0) {
                close(fds[1]);
                return -errno;
        }
        if (pid == 0) {
                /* In a user namespace, the snapshot's root-owned files are
                 * the namespace's root's. */
                StoreMountOptions opts = {
                        .ready_fd = 3,
                        .nofollow = true,
                        .map_root = userns_base != 0,
                        .root_uid = userns_base,
                        .root_gid = (gid_t) userns_base,
                };
                Store *own = NULL;
                char self[32];

                /* The disk I/O it does for the task is the task's. Memory and
                 * processes are not: the kernel's OOM killer must not pick
                 * the server of a task that grew too big. */
                snprintf(self, sizeof self, "%d", (int) getpid());
                for (unsigned c = 0; c < _CG_MAX; c++)
                        if (cg->path[c] && (c == CG_BLKIO || (c == CG_UNIFIED && cg->v2_io))) {
                                char path[4096];
                                int fd;

                                snprintf(path, sizeof path, "%s/cgroup.procs", cg->path[c]);
                                fd = open(path, O_WRONLY | O_CLOEXEC);
                                if (fd >= 0) {
                                        (void) !write(fd, self, strlen(self));
                                        close(fd);
                                }
                        }
                {
                        int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);

                        if (fd >= 0) {
                                (void) !write(fd, "-1000", 5);
                                close(fd);
                        }
                }
                _cleanup_free_ char *path = strdup(store_path(s));

                /* The caller's handlers would keep the server's own (libfuse
                 * sets its handlers only where there are none). */
                for (size_t i = 0; i < ELEMENTSOF(forwarded_signals); i++)
                        (void) signal(forwarded_signals[i], SIG_DFL);
                /* Before any descriptor is closed: see store.h. */
                store_close_inherited();
                (void) setsid();
                /* A caller killed with -9 leaves no mount served behind:
                 * SIGTERM unmounts and ends the server. */
                if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != caller)
                        _exit(EXIT_FAILURE);
                if (!path || dup2(fds[1], 3) < 0 || close_range(4, ~0U, 0) < 0)
                        _exit(EXIT_FAILURE);
                if (store_open(path, &own) < 0)
                        _exit(EXIT_FAILURE);
                _exit(store_mount(own, name, mountpoint, &opts, NULL) < 0 ? EXIT_FAILURE : EXIT_SUCCESS);
        }
        close(fds[1]);
        r = fd_wait_readable(rfd, SERVER_READY_TIMEOUT_MS);
        if (r > 0 && read(rfd, buf, sizeof buf) > 0 && buf[0] == '1') {
                *ret = pid;
                return 0;
        }
        (void) kill(pid, SIGKILL);
        (void) waitpid(pid, NULL, 0);
        return r == 0 ? -ETIMEDOUT : -EIO;
}

/* Unmounts the snapshot and waits for its server to end. The server's last
 * commit holds what the task wrote since the one before, and goes at the
 * pace of the sandbox's own write limit: for a snapshot that is kept, it
 * is waited for however long it takes; one about to be deleted gets 5 s. */
static void stop_server(const char *mountpoint, pid_t server, bool keep_data) {
        if (umount2(mountpoint, UMOUNT_NOFOLLOW) < 0) {
                (void) umount2(mountpoint, MNT_DETACH | UMOUNT_NOFOLLOW);
                /* Still in use on the host, it would go on serving: SIGTERM
                 * ends it as an unmount does, after its last commit. */
                if (keep_data)
                        (void) kill(server, SIGTERM);
        }
        if (keep_data) {
                while (waitpid(server, NULL, 0) < 0 && errno == EINTR)
                        ;
                return;
        }
        for (unsigned i = 0; i < 500; i++) {
                if (waitpid(server, NULL, WNOHANG) == server)
                        return;
                (void) usleep(10000);
        }
        (void) kill(server, SIGKILL);
        (void) waitpid(server, NULL, 0);
}

/* Kills what runs in the sandbox's cgroups, except its server. */
static void kill_task(const Cgroup *cg, pid_t outer, pid_t server) {
        (void) kill(outer, SIGKILL);
        for (unsigned c = 0; c < _CG_MAX; c++) {
                char path[4096];
                FILE *f;
                int pid;

                if (!cg->path[c])
                        continue;
                snprintf(path, sizeof path, "%s/cgroup.procs", cg->path[c]);
                f = fopen(path, "re");
                while (f && fscanf(f, "%d", &pid) == 1)
                        if (pid != server)
                                (void) kill(pid, SIGKILL);
                if (f)
                        fclose(f);
        }
}

/* Waits for the outer child, killing the task at the deadline and passing
 * on the signals the caller got. */
static int wait_task(const Cgroup *cg, pid_t outer, pid_t server, const SandboxOptions *opts,
                     SandboxResult *ret) {
        _cleanup_close_ int pidfd = (int) syscall(SYS_pidfd_open, outer, 0);
        const volatile int *cancel = opts->cancel;
        volatile sig_atomic_t *forward = opts->forward_signal;
        uint64_t timeout_usec = opts->timeout_usec;
        struct timespec start, now;
        int status, r;

        if (pidfd < 0)
                return -errno;
        clock_gettime(CLOCK_MONOTONIC, &start);
        for (;;) {
                int wait_ms = cancel || forward ? 200 : -1;

                if (cancel && *cancel) {
                        ret->cancelled = true;
                        kill_task(cg, outer, server);
                        break;
                }
                if (forward && *forward) {
                        (void) kill(outer, *forward);
                        *forward = 0;
                }
                if (timeout_usec > 0) {
                        uint64_t elapsed;

                        clock_gettime(CLOCK_MONOTONIC, &now);
                        elapsed = (uint64_t) (now.tv_sec - start.tv_sec) * 1000000u +
                                  (uint64_t) ((now.tv_nsec - start.tv_nsec) / 1000);
                        if (elapsed >= timeout_usec) {
                                ret->timed_out = true;
                                kill_task(cg, outer, server);
                                break;
                        }
                        wait_ms = (int) MIN((timeout_usec - elapsed) / 1000 + 1,
                                            (uint64_t) (wait_ms > 0 ? wait_ms : 1000));
                }
                r = fd_wait_readable(pidfd, wait_ms);
                if (r == -EINTR)
                        continue;
                if (r < 0)
                        return r;
                if (r > 0)
                        break;
        }
        if (waitpid(outer, &status, 0) < 0)
                return -errno;
        /* What init says of the task replaces this (run_task()); without
         * it, init itself was killed. */
        if (WIFEXITED(status))
                ret->exit_status = WEXITSTATUS(status);
        else
                ret->exit_status = 128 + WTERMSIG(status);
        if (ret->timed_out || ret->cancelled)
                ret->signal = SIGKILL, ret->exit_status = 128 + SIGKILL;
        else if (ret->exit_status > 128)
                ret->signal = ret->exit_status - 128;
        return 0;
}

static int write_proc(pid_t pid, const char *file, const char *text) {
        char path[64];
        int fd, r = 0;

        snprintf(path, sizeof path, "/proc/%d/%s", (int) pid, file);
        fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        if (write(fd, text, strlen(text)) != (ssize_t) strlen(text))
                r = -errno;
        close(fd);
        return r;
}

/* The outer child has unshared its user namespace: its IDs 0.. are the
 * host's base.. . It waits on the sync pipe until this is done. */
static int write_id_maps(pid_t outer, uid_t base, uint32_t size) {
        char map[64];
        int r;

        /* Until the child has unshared, its maps belong to the host's
         * namespace: wait for that by polling its namespace link. */
        for (unsigned i = 0; i < 1000; i++) {
                char self[64], child[64], path[64];
                ssize_t a, b;

                snprintf(path, sizeof path, "/proc/%d/ns/user", (int) outer);
                a = readlink("/proc/self/ns/user", self, sizeof self - 1);
                b = readlink(path, child, sizeof child - 1);
                if (a > 0 && b > 0 && (a != b || memcmp(self, child, (size_t) a) != 0))
                        break;
                (void) usleep(1000);
        }
        snprintf(map, sizeof map, "0 %u %u\n", (unsigned) base, size);
        r = write_proc(outer, "uid_map", map);
        if (r >= 0)
                r = write_proc(outer, "setgroups", "deny");
        if (r >= 0)
                r = write_proc(outer, "gid_map", map);
        return r;
}

/* Reads what the children said: the first setup failure ("ERRNO text"),
 * returned as a negative errno (0 if none), and the task's wait status
 * ("status N"), -1 in *ret_status if init did not live to say it. */
static int read_child_report(int fd, char *text, size_t size, int *ret_status) {
        char buf[4096];
        ssize_t n = read(fd, buf, sizeof buf - 1);
        int r = 0;

        *ret_status = -1;
        if (n <= 0)
                return 0;
        buf[n] = 0;
        for (char *line = buf, *next; *line; line = next) {
                char *space;
                int e;

                next = line + strcspn(line, "\n");
                if (*next)
                        *next++ = 0;
                if (sscanf(line, "status %d", ret_status) == 1 || r < 0)
                        continue;
                e = (int) strtol(line, &space, 10);
                snprintf(text, size, "%s", space && *space == ' ' ? space + 1 : line);
                r = -(e > 0 ? e : EIO);
        }
        return r;
}

void sandbox_result_clear(SandboxResult *r) {
        free(r->snapshot);
        for (char **p = r->not_applied; p && *p; p++)
                free(*p);
        free(r->not_applied);
        *r = (SandboxResult) {};
}

static int record_cgroup(const char *path, void *userdata) {
        return run_record_add(userdata, "cgroup", path);
}

static int run_task(Store *s, const SandboxOptions *opts, const char *name, RunRecord *record,
                    SandboxResult *ret, char *error_text, size_t error_size) {
        _cleanup_free_ char *sandboxes = NULL, *own_dir = NULL, *mountpoint = NULL, *staging = NULL;
        /* The sandbox's root on the host: the namespace's root must pass
         * through its directory to mount it. */
        uid_t owner = opts->userns_size ? opts->userns_base : 0;
        SandboxOptions named = *opts;
        SandboxLimits limits = opts->limits;
        sigset_t caller_mask;
        char cgroup_name[256];
        Cgroup cg = {};
        pid_t server = 0, outer;
        int errfds[2] = { -EBADF, -EBADF }, syncfds[2] = { -EBADF, -EBADF }, r;
        dev_t dev;

        named.name = name;
        if (asprintf(&sandboxes, "%s-sandboxes", store_path(s)) < 0 ||
            asprintf(&own_dir, "%s/%s", sandboxes, name) < 0 ||
            asprintf(&mountpoint, "%s/root", own_dir) < 0 ||
            asprintf(&staging, "%s/host", own_dir) < 0)
                return -ENOMEM;
        /* The snapshot is mounted for everyone (allow_other: the task's users
         * are not the server's), and holds the image's files, which the
         * store keeps from the host's users: its mount point is in a
         * directory only the sandbox's root may enter. */
        r = make_own_dirs(sandboxes, own_dir, (const char *const[]) {
                                  mountpoint, opts->shape == SANDBOX_WORKDIR ? staging : NULL, NULL }, owner);
        if (r < 0) {
                snprintf(error_text, error_size, "cannot make the sandbox's directories under %s: %s%s", sandboxes,
                         strerror(-r), r == -ELOOP ? " (one that root did not make, or a mount, is there)" : "");
                return r;
        }

        dev = block_device_of(store_path(s));
        /* Unique to this run: the same name may run from another store,
         * or have been left by a run killed with -9. */
        snprintf(cgroup_name, sizeof cgroup_name, "%.200s.%d", name, (int) getpid());
        cg.v2_base = opts->cgroup_base;
        /* Each written down before it is made: a run killed in between
         * leaves nothing the next one does not know of. */
        cg.before_make = record_cgroup;
        cg.before_make_userdata = record;
        r = cgroup_create(&cg, cgroup_name);
        if (r < 0) {
                snprintf(error_text, error_size, "cannot make the sandbox's cgroups, or write them in its record: %s",
                         strerror(-r));
                goto finish;
        }
        /* The sandbox's outer process and its init are in its cgroups
         * too: the limit is on the task's own processes. */
        if (limits.pids_max > 0 && limits.pids_max < UINT64_MAX - 2)
                limits.pids_max += 2;
        cgroup_apply(&cg, &limits, dev);

        r = start_server(s, name, mountpoint, &cg, opts->userns_size ? opts->userns_base : 0, &server);
        if (r < 0) {
                snprintf(error_text, error_size, "cannot serve the snapshot: %s", strerror(-r));
                goto finish;
        }

        if (pipe2(errfds, O_CLOEXEC) < 0 || pipe2(syncfds, O_CLOEXEC) < 0) {
                r = -errno;
                goto finish;
        }
        /* Blocked across the fork: the child must not take one with the
         * caller's handler, which would keep it in the child's memory. */
        {
                sigset_t set = forwarded_set();

                (void) sigprocmask(SIG_BLOCK, &set, &caller_mask);
        }
        outer = fork();
        if (outer != 0)
                (void) sigprocmask(SIG_SETMASK, &caller_mask, NULL);
        if (outer < 0) {
                r = -errno;
                goto finish;
        }
        if (outer == 0) {
                Plan plan = {
                        .opts = &named,
                        .mountpoint = mountpoint,
                        .staging = staging,
                        .store_path = store_path(s),
                        .sandboxes_dir = sandboxes,
                        .error_fd = errfds[1],
                };
                /* The cgroup namespace is made in the sandbox's cgroup, joined
                 * first: the task sees its cgroup as the root, and no host
                 * path. */
                int flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP |
                            (opts->host_network ? 0 : CLONE_NEWNET);
                sigset_t forwarded = forwarded_set();
                pid_t init;
                int status;

                close(errfds[0]);
                close(syncfds[1]);
                (void) sigprocmask(SIG_SETMASK, &forwarded, NULL);
                (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
                /* A session of its own: kill(0, ...) in the task must not
                 * reach the caller's process group. */
                (void) setsid();
                r = cgroup_attach(&cg, getpid());
                if (r < 0)
                        child_fail(errfds[1], -r, "cannot join the sandbox's cgroup: %s", strerror(-r));
                /* The logs are the caller's files: opened as the caller,
                 * before a user namespace or the root changes. */
                redirect(&plan, opts->stdout_path, STDOUT_FILENO);
                redirect(&plan, opts->stderr_path, STDERR_FILENO);
                if (opts->userns_size)
                        flags |= CLONE_NEWUSER;
                if (unshare(flags) < 0)
                        child_fail(errfds[1], errno, "cannot make the namespaces: %m");
                /* The caller writes the ID maps, then closes the pipe. */
                if (opts->userns_size) {
                        char c;

                        if (read(syncfds[0], &c, 1) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
                                child_fail(errfds[1], errno, "cannot become root of the user namespace: %m");
                        /* A change of credentials cleared it. */
                        (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
                }
                close(syncfds[0]);
                init = fork();
                if (init < 0)
                        child_fail(errfds[1], errno, "cannot start the sandbox's init: %m");
                if (init == 0)
                        init_main(&plan);
                close(errfds[1]);
                /* Signals the caller passes on go to init, which passes
                 * them on to the task. */
                init_task = init;
                for (size_t i = 0; i < ELEMENTSOF(forwarded_signals); i++)
                        (void) signal(forwarded_signals[i], init_forward);
                (void) sigprocmask(SIG_UNBLOCK, &forwarded, NULL);
                while (waitpid(init, &status, 0) < 0 && errno == EINTR)
                        ;
                _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        }
        close(errfds[1]);
        errfds[1] = -EBADF;
        close(syncfds[0]);
        syncfds[0] = -EBADF;
        if (opts->userns_size) {
                r = write_id_maps(outer, opts->userns_base, opts->userns_size);
                if (r < 0) {
                        snprintf(error_text, error_size, "cannot write the user namespace's ID maps: %s",
                                 strerror(-r));
                        (void) kill(outer, SIGKILL);
                        (void) waitpid(outer, NULL, 0);
                        goto finish;
                }
        }
        close(syncfds[1]);
        syncfds[1] = -EBADF;

        r = wait_task(&cg, outer, server, opts, ret);
        if (r >= 0) {
                int status;

                r = read_child_report(errfds[0], error_text, error_size, &status);
                if (status >= 0 && !ret->timed_out && !ret->cancelled) {
                        ret->exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                        ret->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
                }
                /* Before the figures: the server's last commit is the
                 * task's I/O too. sandbox_run() deletes the snapshot of a
                 * run that failed or was cancelled. */
                stop_server(mountpoint, server, opts->in_source || (opts->keep && r >= 0 && !ret->cancelled));
                server = 0;
                cgroup_collect(&cg, dev, ret);
        }

finish:
        for (unsigned i = 0; i < 2; i++)
                if (syncfds[i] >= 0)
                        close(syncfds[i]);
        if (errfds[0] >= 0)
                close(errfds[0]);
        if (errfds[1] >= 0)
                close(errfds[1]);
        if (server > 0)
                stop_server(mountpoint, server, false);
        ret->not_applied = cg.not_applied;
        cg.not_applied = NULL;
        cg.n_not_applied = 0;
        cgroup_destroy(&cg);
        (void) rmdir(mountpoint);
        (void) rmdir(staging);
        (void) rmdir(own_dir);
        return r;
}

/* The snapshot by its UUID too: should it be deleted by hand after this
 * run died, whatever takes its name later is not the run's. Synced before
 * the snapshot is made: a power loss may keep the catalog's commit of it
 * and lose the record's unsynced lines. */
static int record_snapshot(RunRecord *record, const char *uuid, const char *name) {
        _cleanup_free_ char *value = NULL;
        int r;

        if (asprintf(&value, "%s %s", uuid, name) < 0)
                return -ENOMEM;
        r = run_record_add(record, "snapshot", value);
        return r < 0 ? r : run_record_sync(record);
}

int sandbox_limit_growth(Store *s, const char *name, uint64_t bytes) {
        _cleanup_(store_subvolume_info_clear) StoreSubvolumeInfo info = {};
        uint64_t quota;
        int r;

        r = store_subvolume_show(s, name, &info);
        if (r < 0)
                return r;
        /* The store takes quotas up to INT64_MAX bytes, which is no limit
         * in effect: a growth past it is limited to that. */
        quota = bytes > (uint64_t) INT64_MAX - MIN(info.logical_bytes, (uint64_t) INT64_MAX) ?
                (uint64_t) INT64_MAX : info.logical_bytes + bytes;
        if (info.quota_bytes > 0 && info.quota_bytes <= quota)
                return 0;
        return store_subvolume_set_quota(s, name, quota);
}

int sandbox_run(Store *s, const SandboxOptions *opts, SandboxResult *ret, char *error_text, size_t error_size) {
        static unsigned counter;
        _cleanup_free_ char *sandboxes = NULL;
        _cleanup_(run_record_remove) RunRecord record = { .fd = -EBADF };
        char name[STORE_NAME_MAX + 1], uuid[37];
        int r, k;

        *ret = (SandboxResult) {};
        error_text[0] = 0;
        if (!opts->source || !opts->argv || !opts->argv[0]) {
                snprintf(error_text, error_size, "a sandbox needs a subvolume and a command");
                return -EINVAL;
        }
        if (opts->shape == SANDBOX_WORKDIR && (!opts->workdir || opts->workdir[0] != '/' ||
                                               path_has_dot_component(opts->workdir, true) ||
                                               path_is_root(opts->workdir))) {
                /* "/." or "//" would make the host's root the working tree,
                 * writable from inside. */
                snprintf(error_text, error_size, "the working tree's path must be absolute, without '.' or '..' "
                         "components, and not '/'");
                return -EINVAL;
        }
        for (char *const *p = opts->keep_capabilities; p && *p; p++)
                if (!sandbox_capability_known(*p)) {
                        snprintf(error_text, error_size, "'%s' is not a capability a task can keep", *p);
                        return -EINVAL;
                }
        for (char *const *p = opts->allow_syscalls; p && *p; p++)
                if (!sandbox_syscall_refused(*p)) {
                        snprintf(error_text, error_size, "'%s' is not a system call the sandbox refuses", *p);
                        return -EINVAL;
                }
        if (opts->userns_base > 0 && opts->userns_size == 0) {
                snprintf(error_text, error_size, "a user namespace needs at least one ID to map");
                return -EINVAL;
        }
        if (opts->hostname && (!opts->hostname[0] || strlen(opts->hostname) > HOST_NAME_MAX)) {
                snprintf(error_text, error_size, "the hostname must be 1 to %d bytes", HOST_NAME_MAX);
                return -EINVAL;
        }
        if (opts->in_source)
                snprintf(name, sizeof name, "%s", opts->source);
        else if (opts->name)
                snprintf(name, sizeof name, "%s", opts->name);
        else
                snprintf(name, sizeof name, "sandbox-%d-%u", (int) getpid(), counter++);
        if (!store_name_is_valid(name)) {
                snprintf(error_text, error_size, "'%s' is not a valid name", name);
                return -EINVAL;
        }

        /* What runners killed before they could clean up left behind. */
        if (sandbox_remove_stale(s) > 0)
                (void) store_reap_in_background(s);

        if (asprintf(&sandboxes, "%s-sandboxes", store_path(s)) < 0)
                return -ENOMEM;
        if (mkdir(sandboxes, 0755) < 0 && errno != EEXIST) {
                r = -errno;
                snprintf(error_text, error_size, "cannot make %s: %m", sandboxes);
                return r;
        }
        r = run_record_create(sandboxes, name, &record);
        if (r == -EEXIST) {
                snprintf(error_text, error_size, "a sandbox named '%s' is running", name);
                return -EBUSY;
        }
        if (r < 0) {
                snprintf(error_text, error_size, "cannot make the sandbox's record in %s: %s", sandboxes,
                         strerror(-r));
                return r;
        }

        /* The snapshot is written down before it is made, by the UUID it
         * is to have: should this run die at any point, the next removes
         * it, and never another subvolume that has the name by then. A
         * snapshot kept under a name the caller chose is theirs; one under
         * a made-up name would be known to nobody. */
        r = store_uuid_new(uuid);
        if (r >= 0 && !opts->in_source && !(opts->keep && opts->name))
                r = record_snapshot(&record, uuid, name);
        if (r < 0) {
                snprintf(error_text, error_size, "cannot write the sandbox's record: %s", strerror(-r));
                return r;
        }
        r = opts->in_source ? 0 : store_subvolume_snapshot_as(s, opts->source, name, false, uuid);
        if (r < 0) {
                snprintf(error_text, error_size, "cannot snapshot '%s' as '%s': %s", opts->source, name,
                         store_strerror(r) ? store_strerror(r) : strerror(-r));
                return r;
        }
        ret->snapshot = strdup(name);
        if (!opts->in_source && opts->disk_max > 0) {
                r = sandbox_limit_growth(s, name, opts->disk_max);
                if (r < 0)
                        snprintf(error_text, error_size, "cannot limit the snapshot's growth: %s", strerror(-r));
        }
        if (r >= 0)
                r = run_task(s, opts, name, &record, ret, error_text, error_size);

        /* A cancelled task was abandoned: nobody may be left to learn the
         * name of a snapshot kept for it. */
        if (!opts->in_source && (!opts->keep || r < 0 || ret->cancelled)) {
                k = store_subvolume_delete(s, name, NULL);
                if (k >= 0)
                        (void) store_reap_in_background(s);
                else if (k != -ENOENT)
                        /* The record stays: the next run deletes it. */
                        run_record_close(&record);
        }
        return r;
}
