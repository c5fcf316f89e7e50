/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* cowbox-store run: a one-shot task in a sandbox made from a new writable
 * snapshot (the work is in runtime/runtime.h). */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "runtime.h"
#include "store-tool.h"
#include "string-util.h"

#define LIST_MAX 64

static int parse_user(const char *text, uid_t *uid, gid_t *gid) {
        uint64_t u, g;
        char buf[64], *colon;

        snprintf(buf, sizeof buf, "%s", text);
        colon = strchr(buf, ':');
        if (colon)
                *colon = 0;
        if (parse_number(buf, &u) < 0 || u >= UINT32_MAX)
                return -EINVAL;
        g = u;
        if (colon && (parse_number(colon + 1, &g) < 0 || g >= UINT32_MAX))
                return -EINVAL;
        *uid = (uid_t) u;
        *gid = (gid_t) g;
        return 0;
}

static json_t *result_to_json(const SandboxResult *r) {
        json_t *list = json_array();

        for (char **p = r->not_applied; p && *p; p++)
                json_array_append_new(list, json_string(*p));
        return json_pack("{s:s?, s:i, s:i, s:b, s:b, s:b, s:I, s:I, s:I, s:I, s:i, s:o}",
                         "snapshot", r->snapshot,
                         "exit_status", r->exit_status,
                         "signal", r->signal,
                         "timed_out", r->timed_out,
                         "oom_killed", r->oom_killed,
                         "pids_limit_hit", r->pids_limit_hit,
                         "cpu_usec", (json_int_t) r->cpu_usec,
                         "memory_peak_bytes", (json_int_t) r->memory_peak,
                         "io_read_bytes", (json_int_t) r->io_read_bytes,
                         "io_write_bytes", (json_int_t) r->io_write_bytes,
                         "cgroup_version", (int) r->cgroup_version,
                         "not_applied", list);
}

static void print_report(const Tool *tool, const SandboxResult *r, bool kept) {
        char a[FORMAT_BYTES_MAX], b[FORMAT_BYTES_MAX], c[FORMAT_BYTES_MAX];

        if (tool->json) {
                json_t *doc = result_to_json(r);

                json_dumpf(doc, stderr, JSON_INDENT(2));
                fputc('\n', stderr);
                json_decref(doc);
                return;
        }
        fprintf(stderr, "%s: the task ", PROGRAM_NAME);
        if (r->timed_out)
                fprintf(stderr, "ran out of time and was killed");
        else if (r->oom_killed)
                fprintf(stderr, "ran out of memory (exit status %d)", r->exit_status);
        else if (r->signal)
                fprintf(stderr, "was killed by signal %d", r->signal);
        else
                fprintf(stderr, "exited with status %d", r->exit_status);
        fprintf(stderr, "%s; CPU %.2f s, peak memory %s, read %s, written %s (cgroup v%u I/O)\n",
                r->pids_limit_hit ? " and hit its process limit" : "", (double) r->cpu_usec / 1e6,
                format_bytes(r->memory_peak, a), format_bytes(r->io_read_bytes, b),
                format_bytes(r->io_write_bytes, c), r->cgroup_version);
        for (char **p = r->not_applied; p && *p; p++)
                fprintf(stderr, "%s: not applied: %s\n", PROGRAM_NAME, *p);
        if (kept)
                fprintf(stderr, "%s: the snapshot '%s' was kept\n", PROGRAM_NAME, r->snapshot);
}

static int add_to_list(char **list, size_t *n, char *item) {
        if (*n + 1 >= LIST_MAX)
                return -E2BIG;
        list[(*n)++] = item;
        list[*n] = NULL;
        return 0;
}

static volatile sig_atomic_t signal_to_pass;

static void on_signal(int sig) {
        signal_to_pass = sig;
}

/* Ctrl-C, SIGTERM and SIGHUP reach the task (it runs in a session of its
 * own, apart from the terminal's): it ends as it chooses, and the run
 * cleans up after it as after any end. */
static void pass_signals_on(void) {
        static const int passed[] = { SIGINT, SIGTERM, SIGHUP };
        struct sigaction sa = { .sa_handler = on_signal };

        sigemptyset(&sa.sa_mask);
        for (size_t i = 0; i < ELEMENTSOF(passed); i++)
                (void) sigaction(passed[i], &sa, NULL);
}

static int verb_run(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        char *allow[LIST_MAX] = {}, *caps[LIST_MAX] = {};
        size_t n_allow = 0, n_caps = 0;
        SandboxOptions opts = { .shape = SANDBOX_ROOT };
        SandboxResult result = {};
        _cleanup_store_ Store *store = NULL;
        _cleanup_free_ char *cgroup_base = NULL;
        char error[512];
        uint64_t v;
        int c, r;

        while ((c = command_getopt(tool, cmd, argc, argv)) > 0) {
                uint64_t *size_target = NULL, *number_target = NULL;

                switch (c) {
                case ARG_WORKDIR: opts.shape = SANDBOX_WORKDIR; opts.workdir = optarg; break;
                case ARG_KEEP: opts.keep = true; break;
                case ARG_NAME: opts.name = optarg; break;
                case ARG_HOSTNAME: opts.hostname = optarg; break;
                case ARG_HOST_NETWORK: opts.host_network = true; break;
                case ARG_CWD: opts.cwd = optarg; break;
                case ARG_STDOUT: opts.stdout_path = optarg; break;
                case ARG_STDERR: opts.stderr_path = optarg; break;
                case ARG_KILL_ON_REFUSAL: opts.kill_on_refusal = true; break;
                case ARG_MEMORY_MAX: size_target = &opts.limits.memory_max; break;
                case ARG_DISK_MAX: size_target = &opts.disk_max; break;
                case ARG_IO_READ_BPS: size_target = &opts.limits.io_read_bps; break;
                case ARG_IO_WRITE_BPS: size_target = &opts.limits.io_write_bps; break;
                case ARG_PIDS_MAX: number_target = &opts.limits.pids_max; break;
                case ARG_CPU: number_target = &opts.limits.cpu_percent; break;
                case ARG_IO_READ_IOPS: number_target = &opts.limits.io_read_iops; break;
                case ARG_IO_WRITE_IOPS: number_target = &opts.limits.io_write_iops; break;
                case ARG_IO_WEIGHT: number_target = &opts.limits.io_weight; break;
                case ARG_IO_LATENCY: number_target = &opts.limits.io_latency_us; break;
                case ARG_TIMEOUT:
                        if (parse_number(optarg, &v) < 0 || v == 0 || v > UINT64_MAX / 1000000)
                                return report_usage_error(cmd, "--timeout takes a number of seconds, not '%s'", optarg);
                        opts.timeout_usec = v * 1000000;
                        break;
                case ARG_USERNS: {
                        uid_t base;
                        gid_t size;

                        if (parse_user(optarg, &base, &size) < 0 || base == 0 ||
                            (strchr(optarg, ':') && size == 0))
                                return report_usage_error(cmd, "--user-namespace takes BASE[:SIZE], BASE and SIZE "
                                                          "above 0, not '%s'", optarg);
                        opts.userns_base = base;
                        opts.userns_size = strchr(optarg, ':') ? (uint32_t) size : 65536;
                        break;
                }
                case ARG_USER:
                        if (parse_user(optarg, &opts.uid, &opts.gid) < 0)
                                return report_usage_error(cmd, "--user takes UID or UID:GID, not '%s'", optarg);
                        break;
                case ARG_ALLOW_SYSCALL:
                        if (!sandbox_syscall_refused(optarg))
                                return report_usage_error(cmd, "'%s' is not a system call the sandbox refuses: "
                                                          "only those can be let through (see the README)",
                                                          optarg);
                        if (add_to_list(allow, &n_allow, optarg) < 0)
                                return report_usage_error(cmd, "too many --allow-syscall");
                        break;
                case ARG_KEEP_CAP:
                        if (!sandbox_capability_known(optarg))
                                return report_usage_error(cmd, "'%s' is not a capability: give its name as "
                                                          "capabilities(7) does, such as CAP_NET_ADMIN", optarg);
                        if (add_to_list(caps, &n_caps, optarg) < 0)
                                return report_usage_error(cmd, "too many --keep-capability");
                        break;
                }
                if (size_target && parse_size(optarg, size_target) < 0)
                        return report_usage_error(cmd, "'%s' is not a size (e.g. 512M)", optarg);
                if (number_target && parse_number(optarg, number_target) < 0)
                        return report_usage_error(cmd, "'%s' is not a number", optarg);
        }
        if (c < 0)
                return options_exit_status(c);
        if (argc - optind < 2)
                return report_usage_error(cmd, "give a subvolume and a command: run SUBVOL -- COMMAND [ARG...]");
        r = command_check_name(cmd, argv[optind]);
        if (r == 0 && opts.name)
                r = command_check_new_name(cmd, opts.name);
        if (r != 0)
                return r;
        opts.source = argv[optind];
        opts.argv = argv + optind + 1;
        if (streq(opts.argv[0], "--"))
                opts.argv++;
        if (!opts.argv[0])
                return report_usage_error(cmd, "give the command after '--'");
        opts.allow_syscalls = allow;
        opts.keep_capabilities = caps;

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;
        /* Run from a delegated cgroup (systemd-run --scope -p Delegate=yes),
         * the sandbox's v2 cgroup can have controllers: made below it,
         * with this process in a leaf of its own. */
        r = runtime_cgroup_delegate(&cgroup_base);
        if (r < 0)
                report_warning("cannot move into a leaf of the cgroup delegated to it (%s): cgroup v2 limits "
                               "will not apply", strerror(-r));
        opts.cgroup_base = cgroup_base;
        opts.forward_signal = &signal_to_pass;
        pass_signals_on();
        r = sandbox_run(store, &opts, &result, error, sizeof error);
        if (r < 0) {
                sandbox_result_clear(&result);
                return report_failure("cannot run the task: %s", error[0] ? error : error_text(r));
        }
        print_report(tool, &result, opts.keep);
        r = result.exit_status;
        sandbox_result_clear(&result);
        return r;
}

const Command command_run = {
        .name = "run",
        .synopsis = "[OPTIONS] SUBVOL -- COMMAND [ARG...]",
        .summary = "Run a task in a sandbox made from a new writable snapshot of SUBVOL.",
        .description =
                "The task gets fresh mount, PID, IPC, UTS and network namespaces (loopback only),\n"
                "an init as PID 1, a minimal /dev, its own /proc and /tmp, a seccomp filter that\n"
                "refuses what builds never need (EPERM), no new privileges, a reduced set of\n"
                "capabilities, and a cgroup with the limits given. The snapshot is its root file\n"
                "system, or with --workdir its working tree at PATH while it sees the host read-\n"
                "only. The FUSE server of the snapshot runs in the task's I/O cgroup: the disk\n"
                "I/O done for the task is charged to it. Afterwards the snapshot is deleted (and\n"
                "reaped) unless --keep. The report goes to standard error (JSON with --json);\n"
                "limits the host cannot apply are named there. The exit status is the task's\n"
                "(128 + the signal if killed). SIGINT, SIGTERM and SIGHUP are passed on to the\n"
                "task; a run killed with -9 leaves what it made to the next run to remove.\n",
        .options = (const CommandOption[]) {
                { ARG_WORKDIR, "workdir", "PATH", "see the host read-only, the snapshot at PATH" },
                { ARG_KEEP, "keep", NULL, "keep the snapshot afterwards" },
                { ARG_NAME, "name", "NAME", "the snapshot's name (default: made up)" },
                { ARG_TIMEOUT, "timeout", "SECONDS", "kill the task after this long" },
                { ARG_MEMORY_MAX, "memory-max", "BYTES", "memory limit" },
                { ARG_DISK_MAX, "disk-max", "BYTES", "how much the snapshot's files may grow (a quota)" },
                { ARG_PIDS_MAX, "pids-max", "N", "process limit" },
                { ARG_CPU, "cpu", "PERCENT", "CPU limit, in percent of one CPU" },
                { ARG_IO_READ_BPS, "io-read-bps", "BYTES", "read limit per second on the store's disk" },
                { ARG_IO_WRITE_BPS, "io-write-bps", "BYTES", "write limit per second" },
                { ARG_IO_READ_IOPS, "io-read-iops", "N", "read operations per second" },
                { ARG_IO_WRITE_IOPS, "io-write-iops", "N", "write operations per second" },
                { ARG_IO_WEIGHT, "io-weight", "N", "proportional I/O weight" },
                { ARG_IO_LATENCY, "io-latency-us", "N", "I/O latency target (cgroup v2)" },
                { ARG_USER, "user", "UID[:GID]", "run the task as this user" },
                { ARG_USERNS, "user-namespace", "BASE[:SIZE]", "a user namespace: IDs 0.. inside are BASE..\n"
                  "outside (SIZE 65536 by default)" },
                { ARG_CWD, "cwd", "DIR", "the task's working directory" },
                { ARG_HOSTNAME, "hostname", "NAME", "the sandbox's hostname" },
                { ARG_HOST_NETWORK, "host-network", NULL, "use the host's network" },
                { ARG_STDOUT, "stdout", "FILE", "the task's standard output, a host file" },
                { ARG_STDERR, "stderr", "FILE", "the task's standard error" },
                { ARG_ALLOW_SYSCALL, "allow-syscall", "NAME", "let a refused system call through" },
                { ARG_KEEP_CAP, "keep-capability", "CAP_...", "keep a capability the task loses" },
                { ARG_KILL_ON_REFUSAL, "kill-on-refusal", NULL, "kill the task on a refused call" },
                {}
        },
        .examples = (const char *const[]) {
                PROGRAM_NAME " run base -- /bin/sh -c 'make test'",
                PROGRAM_NAME " run --workdir /src --memory-max 2G checkout -- make -C /src",
                PROGRAM_NAME " --json run --io-read-bps 10M base -- cat /data/big",
                NULL,
        },
        .flags = COMMAND_JSON | COMMAND_OPTIONS_FIRST | COMMAND_REPORT_ON_STDERR,
        .run = verb_run,
};
