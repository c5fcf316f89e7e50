/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * What a task may not do: the capabilities it keeps (those a build or a
 * service uses, as container engines keep), no new privileges, and a
 * seccomp filter (libseccomp) that refuses what builds and services never
 * need, with EPERM unless asked to kill.
 */

#include <errno.h>
#include <sched.h>
#include <linux/capability.h>
#include <seccomp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime-internal.h"
#include "string-util.h"

static const struct {
        const char *name;
        int value;
} capabilities[] = {
        { "CAP_CHOWN", CAP_CHOWN },                     { "CAP_DAC_OVERRIDE", CAP_DAC_OVERRIDE },
        { "CAP_DAC_READ_SEARCH", CAP_DAC_READ_SEARCH }, { "CAP_FOWNER", CAP_FOWNER },
        { "CAP_FSETID", CAP_FSETID },                   { "CAP_KILL", CAP_KILL },
        { "CAP_SETGID", CAP_SETGID },                   { "CAP_SETUID", CAP_SETUID },
        { "CAP_SETPCAP", CAP_SETPCAP },                 { "CAP_LINUX_IMMUTABLE", CAP_LINUX_IMMUTABLE },
        { "CAP_NET_BIND_SERVICE", CAP_NET_BIND_SERVICE }, { "CAP_NET_BROADCAST", CAP_NET_BROADCAST },
        { "CAP_NET_ADMIN", CAP_NET_ADMIN },             { "CAP_NET_RAW", CAP_NET_RAW },
        { "CAP_IPC_LOCK", CAP_IPC_LOCK },               { "CAP_IPC_OWNER", CAP_IPC_OWNER },
        { "CAP_SYS_MODULE", CAP_SYS_MODULE },           { "CAP_SYS_RAWIO", CAP_SYS_RAWIO },
        { "CAP_SYS_CHROOT", CAP_SYS_CHROOT },           { "CAP_SYS_PTRACE", CAP_SYS_PTRACE },
        { "CAP_SYS_PACCT", CAP_SYS_PACCT },             { "CAP_SYS_ADMIN", CAP_SYS_ADMIN },
        { "CAP_SYS_BOOT", CAP_SYS_BOOT },               { "CAP_SYS_NICE", CAP_SYS_NICE },
        { "CAP_SYS_RESOURCE", CAP_SYS_RESOURCE },       { "CAP_SYS_TIME", CAP_SYS_TIME },
        { "CAP_SYS_TTY_CONFIG", CAP_SYS_TTY_CONFIG },   { "CAP_MKNOD", CAP_MKNOD },
        { "CAP_LEASE", CAP_LEASE },                     { "CAP_AUDIT_WRITE", CAP_AUDIT_WRITE },
        { "CAP_AUDIT_CONTROL", CAP_AUDIT_CONTROL },     { "CAP_SETFCAP", CAP_SETFCAP },
        { "CAP_MAC_OVERRIDE", CAP_MAC_OVERRIDE },       { "CAP_MAC_ADMIN", CAP_MAC_ADMIN },
        { "CAP_SYSLOG", CAP_SYSLOG },                   { "CAP_WAKE_ALARM", CAP_WAKE_ALARM },
        { "CAP_BLOCK_SUSPEND", CAP_BLOCK_SUSPEND },     { "CAP_AUDIT_READ", CAP_AUDIT_READ },
        { "CAP_PERFMON", CAP_PERFMON },                 { "CAP_BPF", CAP_BPF },
        { "CAP_CHECKPOINT_RESTORE", CAP_CHECKPOINT_RESTORE },
};

/* What a task keeps by default: enough to install packages and run
 * services as root inside, nothing that reaches the host. */
static const int default_capabilities[] = {
        CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_KILL, CAP_SETGID, CAP_SETUID,
        CAP_SETPCAP, CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT, CAP_MKNOD, CAP_AUDIT_WRITE, CAP_SETFCAP,
};

/* Refused by default; a sandbox may let some through by name. */
static const char *const refused_syscalls[] = {
        "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
        "swapon", "swapoff", "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen",
        "fsmount", "fsconfig", "fspick", "mount_setattr", "keyctl", "add_key", "request_key", "bpf",
        "perf_event_open", "ptrace", "process_vm_readv", "process_vm_writev", "open_by_handle_at",
        "name_to_handle_at", "setns", "unshare", "acct", "quotactl", "settimeofday", "clock_settime",
        "clock_adjtime", "adjtimex", "syslog", "userfaultfd", "lookup_dcookie", "iopl", "ioperm",
        "vhangup", "kcmp", "nfsservctl", "uselib", "personality", "fanotify_init", "pidfd_getfd",
        "process_madvise", "io_uring_setup", "io_uring_enter", "io_uring_register",
};

/* New namespaces are refused through clone() as through unshare(): a user
 * namespace would give the task the kernel's surface of a namespace's
 * root (netfilter, raw sockets) again. */
static const unsigned long namespace_flags[] = {
        CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP,
};

bool sandbox_capability_known(const char *name) {
        for (size_t i = 0; i < sizeof capabilities / sizeof capabilities[0]; i++)
                if (streq(capabilities[i].name, name))
                        return true;
        return false;
}

bool sandbox_syscall_refused(const char *name) {
        for (size_t i = 0; i < sizeof refused_syscalls / sizeof refused_syscalls[0]; i++)
                if (streq(refused_syscalls[i], name))
                        return true;
        return false;
}

static bool in_list(char *const *list, const char *name) {
        for (char *const *p = list; p && *p; p++)
                if (streq(*p, name))
                        return true;
        return false;
}

static int set_capabilities(const SandboxOptions *opts) {
        struct __user_cap_header_struct header = { .version = _LINUX_CAPABILITY_VERSION_3 };
        struct __user_cap_data_struct data[2] = {};
        uint64_t keep = 0;

        for (size_t i = 0; i < sizeof default_capabilities / sizeof default_capabilities[0]; i++)
                keep |= UINT64_C(1) << default_capabilities[i];
        for (size_t i = 0; i < sizeof capabilities / sizeof capabilities[0]; i++)
                if (in_list(opts->keep_capabilities, capabilities[i].name))
                        keep |= UINT64_C(1) << capabilities[i].value;

        /* The bounding set first: nothing dropped here comes back. */
        for (int cap = 0; cap <= CAP_LAST_CAP; cap++)
                if (!(keep & (UINT64_C(1) << cap)) && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
                        return -errno;
        data[0].effective = data[0].permitted = data[0].inheritable = (uint32_t) keep;
        data[1].effective = data[1].permitted = data[1].inheritable = (uint32_t) (keep >> 32);
        if (syscall(SYS_capset, &header, data) < 0)
                return -errno;
        return 0;
}

/* personality(): the personas of builds for another word size get
 * through (PER_LINUX32 and UNAME26, which linux32 and setarch i686 set,
 * PER_LINUX, and the query 0xffffffff); any other value, such as the
 * flags that undo the kernel's mitigations (READ_IMPLIES_EXEC,
 * ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO), is refused. A rule compares an
 * argument once only, so "none of those" is spelled as what differs from
 * each of them: a bit other than theirs set while some other bit is
 * clear, or a bit past the 32 the kernel reads. */
static int refuse_personalities(scmp_filter_ctx ctx, uint32_t action) {
        const uint32_t allowed = PER_LINUX32 | UNAME26, top = UINT32_C(1) << 31;
        int r;

        r = seccomp_rule_add(ctx, action, SCMP_SYS(personality), 1, SCMP_A0(SCMP_CMP_GT, UINT32_MAX));
        for (unsigned b = 0; b < 31 && r >= 0; b++) {
                uint32_t bit = UINT32_C(1) << b;

                /* Bit 31 set, bit b clear. */
                r = seccomp_rule_add(ctx, action, SCMP_SYS(personality), 1,
                                     SCMP_A0(SCMP_CMP_MASKED_EQ, top | bit, top));
                /* Bit b set, bit 31 clear. */
                if (r >= 0 && !(allowed & bit))
                        r = seccomp_rule_add(ctx, action, SCMP_SYS(personality), 1,
                                             SCMP_A0(SCMP_CMP_MASKED_EQ, top | bit, bit));
        }
        return r;
}

static int load_filter(const SandboxOptions *opts) {
        uint32_t action = opts->kill_on_refusal ? SCMP_ACT_KILL_PROCESS : SCMP_ACT_ERRNO(EPERM);
        scmp_filter_ctx ctx;
        int r = 0;

        ctx = seccomp_init(SCMP_ACT_ALLOW);
        if (!ctx)
                return -ENOMEM;
        for (size_t i = 0; i < sizeof refused_syscalls / sizeof refused_syscalls[0] && r >= 0; i++) {
                int nr = seccomp_syscall_resolve_name(refused_syscalls[i]);

                if (nr == __NR_SCMP_ERROR || in_list(opts->allow_syscalls, refused_syscalls[i]))
                        continue;
                r = nr == SCMP_SYS(personality) ? refuse_personalities(ctx, action)
                                                : seccomp_rule_add(ctx, action, nr, 0);
        }
        if (!in_list(opts->allow_syscalls, "unshare")) {
                for (size_t i = 0; i < sizeof namespace_flags / sizeof namespace_flags[0] && r >= 0; i++)
                        r = seccomp_rule_add(ctx, action, SCMP_SYS(clone), 1,
                                             SCMP_A0(SCMP_CMP_MASKED_EQ, namespace_flags[i], namespace_flags[i]));
                /* clone3()'s flags are in memory the filter cannot read:
                 * ENOSYS makes the C library fall back to clone(). */
                if (r >= 0)
                        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
        }
        /* vsock has no network namespaces: its sockets reach the
         * hypervisor's services and those of the host's own listeners
         * from a sandbox meant to have loopback only. */
        if (r >= 0 && !opts->host_network)
                r = seccomp_rule_add(ctx, action, SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_EQ, AF_VSOCK));
        /* The filter keeps no_new_privs itself. */
        if (r >= 0)
                r = seccomp_load(ctx);
        seccomp_release(ctx);
        return r;
}

int confine_task(const SandboxOptions *opts) {
        int r;

        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
                return -errno;
        r = set_capabilities(opts);
        if (r < 0)
                return r;
        return load_filter(opts);
}
