/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * A static program the sandbox tests put into images: it tries one thing
 * from inside a sandbox and prints what happened, one line, so that the
 * test needs nothing else from the image.
 *
 *   info                 pid, parent, hostname, processes seen in /proc
 *   write PATH TEXT      writes a file
 *   read PATH            reads a file; prints bytes and seconds
 *   writeback PATH MB    writes MB MiB and fsyncs; prints bytes and seconds
 *   xor SRC DST          writes SRC's bytes xor 0x5a to DST, with no fsync
 *   alloc MB             allocates and touches MB MiB
 *   forkbomb             forks until it cannot; prints how far it got
 *   sleep SECONDS
 *   mark ID              writes /mark-ID, waits a second, lists the marks it sees
 *   print BYTES          prints BYTES bytes of \x01, which JSON escapes six times over
 *   sysctl PATH          writes a /proc/sys file's own value back to it
 *   mknod                makes a node of /dev/null's numbers in /dev and opens it
 *   fds                  counts the open descriptors past 2
 *   clone-ns | clone3-ns makes a user namespace with clone() or clone3()
 *   cgroup               prints the cgroup paths of /proc/self/cgroup
 *   exit STATUS          exits with STATUS
 *   raise SIGNAL         kills itself with SIGNAL
 *   trap-term SECONDS    prints "trapping", sleeps; on SIGTERM prints "caught" and exits 7
 *   personality VALUE... sets each persona (hex), back to PER_LINUX between
 *   vsock                makes an AF_VSOCK socket
 *   mount | module | unshare | ptrace PID | chroot-escape | ls DIR
 */

#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <linux/sched.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static int result(const char *what, int r) {
        printf("%s %s\n", what, r < 0 ? strerrorname_np(errno) : "ok");
        return 0;
}

static int cmd_info(void) {
        char host[256] = "";
        DIR *d = opendir("/proc");
        struct dirent *de;
        int procs = 0;

        gethostname(host, sizeof host);
        while (d && (de = readdir(d)))
                if (de->d_name[0] >= '0' && de->d_name[0] <= '9')
                        procs++;
        printf("pid %d ppid %d hostname %s procs %d\n", (int) getpid(), (int) getppid(), host, procs);
        return 0;
}

static int cmd_read(const char *path) {
        static char buf[1 << 20];
        double start = now();
        long long total = 0;
        ssize_t n;
        int fd = open(path, O_RDONLY);

        if (fd < 0)
                return result("read", -1);
        while ((n = read(fd, buf, sizeof buf)) > 0)
                total += n;
        printf("read %lld %.3f\n", total, now() - start);
        return n < 0;
}

static int cmd_writeback(const char *path, long mb) {
        static char buf[1 << 20];
        double start = now();
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

        if (fd < 0)
                return result("writeback", -1);
        for (long i = 0; i < mb; i++) {
                /* Every MiB its own: the store would keep a repeated block once. */
                for (size_t j = 0; j < sizeof buf; j++)
                        buf[j] = (char) (rand() & 0xff);
                if (write(fd, buf, sizeof buf) != (ssize_t) sizeof buf)
                        return result("writeback", -1);
        }
        if (fsync(fd) < 0)
                return result("writeback", -1);
        printf("writeback %ld %.3f\n", mb << 20, now() - start);
        return 0;
}

static int cmd_xor(const char *src, const char *dst) {
        static char buf[1 << 20];
        long long total = 0;
        ssize_t n;
        int in = open(src, O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0644);

        if (in < 0 || out < 0)
                return result("xor", -1);
        while ((n = read(in, buf, sizeof buf)) > 0) {
                for (ssize_t i = 0; i < n; i++)
                        buf[i] ^= 0x5a;
                if (write(out, buf, (size_t) n) != n)
                        return result("xor", -1);
                total += n;
        }
        if (n < 0 || close(out) < 0)
                return result("xor", -1);
        printf("xor %lld\n", total);
        return 0;
}

static int cmd_alloc(long mb) {
        for (long i = 0; i < mb; i++) {
                char *p = malloc(1 << 20);

                if (!p)
                        return result("alloc", -1);
                memset(p, 1, 1 << 20);
        }
        printf("alloc %ld ok\n", mb);
        return 0;
}

static int cmd_forkbomb(void) {
        int made = 0;

        for (;;) {
                pid_t pid = fork();

                if (pid < 0) {
                        printf("forkbomb stopped %d %s\n", made, strerrorname_np(errno));
                        fflush(stdout);
                        kill(0, SIGKILL);
                        return 0;
                }
                if (pid == 0) {
                        pause();
                        _exit(0);
                }
                if (++made > 100000) {
                        printf("forkbomb unstopped %d\n", made);
                        return 1;
                }
        }
}

/* The classic: chroot into a subdirectory, climb out with "..", chroot to
 * what is reached. Inside a mount namespace with pivot_root it stays in. */
static int cmd_chroot_escape(void) {
        mkdir("/tmp/jail", 0755);
        if (chroot("/tmp/jail") < 0)
                return result("chroot", -1);
        for (int i = 0; i < 64; i++)
                (void) chdir("..");
        (void) chroot(".");
        return cmd_info(), printf("usr %s\n", access("/usr", F_OK) == 0 ? "visible" : "absent"), 0;
}

static int cmd_sysctl(const char *path) {
        char value[4096];
        ssize_t n;
        int fd = open(path, O_RDONLY);

        if (fd < 0)
                return result("sysctl", -1);
        n = read(fd, value, sizeof value);
        close(fd);
        fd = open(path, O_WRONLY);
        if (n < 0 || fd < 0)
                return result("sysctl", -1);
        n = write(fd, value, (size_t) n);
        close(fd);
        return result("sysctl", n < 0 ? -1 : 0);
}

static int cmd_mknod(void) {
        int fd;

        if (mknod("/dev/probe-null", S_IFCHR | 0666, makedev(1, 3)) < 0)
                return result("mknod", -1);
        fd = open("/dev/probe-null", O_RDWR);
        return result("mknod-open", fd);
}

static int cmd_fds(void) {
        DIR *d = opendir("/proc/self/fd");
        struct dirent *de;
        int n = 0;

        while (d && (de = readdir(d)))
                if (atoi(de->d_name) > 2 && atoi(de->d_name) != dirfd(d))
                        n++;
        printf("fds %d\n", n);
        return 0;
}

static int cmd_clone_ns(bool clone3) {
        struct clone_args args = { .flags = CLONE_NEWUSER, .exit_signal = SIGCHLD };
        long pid = clone3 ? syscall(SYS_clone3, &args, sizeof args)
                          : syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, NULL, NULL, NULL, 0);

        if (pid == 0)
                _exit(0);
        if (pid > 0)
                (void) waitpid((pid_t) pid, NULL, 0);
        return result(clone3 ? "clone3-ns" : "clone-ns", pid < 0 ? -1 : 0);
}

static int cmd_ls(const char *path) {
        DIR *d = opendir(path);
        struct dirent *de;

        if (!d)
                return result("ls", -1);
        while ((de = readdir(d)))
                if (de->d_name[0] != '.')
                        printf("%s ", de->d_name);
        printf("\n");
        return 0;
}

static int cmd_personality(int argc, char *argv[]) {
        printf("personality");
        for (int i = 0; i < argc; i++) {
                long r = syscall(SYS_personality, strtoul(argv[i], NULL, 16));

                printf(" %s", r == -1 ? strerrorname_np(errno) : "ok");
                (void) syscall(SYS_personality, 0UL);
        }
        printf("\n");
        return 0;
}

static void on_term(int sig) {
        (void) sig;
        (void) !write(STDOUT_FILENO, "caught\n", 7);
        _exit(7);
}

int main(int argc, char *argv[]) {
        const char *cmd = argc > 1 ? argv[1] : "info";

        setvbuf(stdout, NULL, _IOLBF, 0);
        if (!strcmp(cmd, "info"))
                return cmd_info();
        if (!strcmp(cmd, "write") && argc > 3) {
                FILE *f = fopen(argv[2], "w");

                if (!f || fputs(argv[3], f) < 0 || fclose(f) != 0)
                        return result("write", -1), 1;
                return result("write", 0);
        }
        if (!strcmp(cmd, "read") && argc > 2)
                return cmd_read(argv[2]);
        if (!strcmp(cmd, "writeback") && argc > 3)
                return cmd_writeback(argv[2], atol(argv[3]));
        if (!strcmp(cmd, "xor") && argc > 3)
                return cmd_xor(argv[2], argv[3]);
        if (!strcmp(cmd, "alloc") && argc > 2)
                return cmd_alloc(atol(argv[2]));
        if (!strcmp(cmd, "forkbomb"))
                return cmd_forkbomb();
        if (!strcmp(cmd, "sleep") && argc > 2)
                return sleep((unsigned) atoi(argv[2])), 0;
        if (!strcmp(cmd, "mount"))
                return result("mount", mount("tmpfs", "/tmp", "tmpfs", 0, NULL));
        if (!strcmp(cmd, "module"))
                return result("module", (int) syscall(SYS_finit_module, 0, "", 0));
        if (!strcmp(cmd, "unshare"))
                return result("unshare", unshare(CLONE_NEWUSER));
        if (!strcmp(cmd, "ptrace") && argc > 2)
                return result("ptrace", (int) ptrace(PTRACE_ATTACH, (pid_t) atoi(argv[2]), NULL, NULL));
        if (!strcmp(cmd, "chroot-escape"))
                return cmd_chroot_escape();
        if (!strcmp(cmd, "mark") && argc > 2) {
                char path[64];
                DIR *d;
                struct dirent *de;
                FILE *f;

                snprintf(path, sizeof path, "/mark-%s", argv[2]);
                f = fopen(path, "w");
                if (!f || fclose(f) != 0)
                        return result("mark", -1), 1;
                sleep(1);
                d = opendir("/");
                printf("marks");
                while (d && (de = readdir(d)))
                        if (!strncmp(de->d_name, "mark-", 5))
                                printf(" %s", de->d_name + 5);
                printf("\n");
                return 0;
        }
        if (!strcmp(cmd, "uidmap")) {
                char line[128] = "";
                FILE *f = fopen("/proc/self/uid_map", "r");

                if (f && fgets(line, sizeof line, f))
                        printf("uidmap %s", line);
                printf("uid %d\n", (int) getuid());
                return 0;
        }
        if (!strcmp(cmd, "vsock"))
                return result("vsock", socket(AF_VSOCK, SOCK_STREAM, 0));
        if (!strcmp(cmd, "personality"))
                return cmd_personality(argc - 2, argv + 2);
        if (!strcmp(cmd, "ls") && argc > 2)
                return cmd_ls(argv[2]);
        if (!strcmp(cmd, "sysctl") && argc > 2)
                return cmd_sysctl(argv[2]);
        if (!strcmp(cmd, "mknod"))
                return cmd_mknod();
        if (!strcmp(cmd, "fds"))
                return cmd_fds();
        if (!strcmp(cmd, "cgroup")) {
                char line[4096];
                FILE *f = fopen("/proc/self/cgroup", "re");

                printf("cgroups");
                while (f && fgets(line, sizeof line, f))
                        printf(" %s", strrchr(line, ':') ? strtok(strrchr(line, ':') + 1, "\n") ?: "" : "?");
                printf("\n");
                return 0;
        }
        if (!strcmp(cmd, "clone-ns") || !strcmp(cmd, "clone3-ns"))
                return cmd_clone_ns(!strcmp(cmd, "clone3-ns"));
        if (!strcmp(cmd, "exit") && argc > 2)
                return atoi(argv[2]);
        if (!strcmp(cmd, "raise") && argc > 2) {
                (void) signal(atoi(argv[2]), SIG_DFL);
                (void) raise(atoi(argv[2]));
                return 0;
        }
        if (!strcmp(cmd, "trap-term") && argc > 2) {
                (void) signal(SIGTERM, on_term);
                printf("trapping\n");
                fflush(stdout);
                sleep((unsigned) atoi(argv[2]));
                return 0;
        }
        if (!strcmp(cmd, "print") && argc > 2) {
                for (long n = atol(argv[2]); n > 0; n--)
                        putchar('\x01');
                return 0;
        }
        fprintf(stderr, "sandbox-probe: unknown command\n");
        return 2;
}
