/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * A sandbox's cgroups. The host may have the unified (v2) tree, v1
 * hierarchies, or both (hybrid): each controller is used where the host
 * has it, a v2 controller first. The sandbox's cgroup is made below this
 * process's own cgroup in each hierarchy, so that the sandbox is limited
 * within whatever limits the caller has.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "cleanup.h"
#include "runtime-internal.h"
#include "string-util.h"

/* PID_MAX_LIMIT on 64-bit machines: pids.max takes no more. */
#define PIDS_LIMIT_MAX UINT64_C(4194304)

static const char *const v1_names[_CG_MAX] = {
        [CG_BLKIO] = "blkio",
        [CG_MEMORY] = "memory",
        [CG_PIDS] = "pids",
        [CG_CPU] = "cpu",
        [CG_CPUACCT] = "cpuacct",
};

_printf_(2, 3)
static void not_applied(Cgroup *cg, const char *format, ...) {
        char **list, *text = NULL;
        va_list ap;

        va_start(ap, format);
        if (vasprintf(&text, format, ap) < 0)
                text = NULL;
        va_end(ap);
        if (!text)
                return;
        list = realloc(cg->not_applied, (cg->n_not_applied + 2) * sizeof *list);
        if (!list) {
                free(text);
                return;
        }
        cg->not_applied = list;
        list[cg->n_not_applied++] = text;
        list[cg->n_not_applied] = NULL;
}

/* Whether the comma-separated list holds word. */
static bool has_word(const char *list, const char *word) {
        size_t n = strlen(word);

        for (const char *p = list; p && *p;) {
                const char *comma = strchr(p, ',');
                size_t len = comma ? (size_t) (comma - p) : strlen(p);

                if (len == n && strncmp(p, word, n) == 0)
                        return true;
                p = comma ? comma + 1 : NULL;
        }
        return false;
}

/* Mount points of the hierarchies. */
static void find_mounts(char *ret[_CG_MAX]) {
        _cleanup_fclose_ FILE *f = fopen("/proc/self/mountinfo", "re");
        char line[4096];

        while (f && fgets(line, sizeof line, f)) {
                char mountpoint[PATH_MAX], fstype[64], options[1024];
                const char *dash = strstr(line, " - ");

                if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", mountpoint) != 1 ||
                    sscanf(dash + 3, "%63s %*s %1023s", fstype, options) != 2)
                        continue;
                if (streq(fstype, "cgroup2") && !ret[CG_UNIFIED])
                        ret[CG_UNIFIED] = strdup(mountpoint);
                else if (streq(fstype, "cgroup"))
                        for (unsigned c = CG_BLKIO; c < _CG_MAX; c++)
                                if (!ret[c] && has_word(options, v1_names[c]))
                                        ret[c] = strdup(mountpoint);
        }
}

/* This process's cgroup in each hierarchy. */
static void find_own(char *ret[_CG_MAX]) {
        _cleanup_fclose_ FILE *f = fopen("/proc/self/cgroup", "re");
        char line[4096];

        while (f && fgets(line, sizeof line, f)) {
                char *controllers = strchr(line, ':'), *path;

                if (!controllers)
                        continue;
                controllers++;
                path = strchr(controllers, ':');
                if (!path)
                        continue;
                *path++ = 0;
                path[strcspn(path, "\n")] = 0;
                if (!*controllers)
                        ret[CG_UNIFIED] = strdup(path);
                else
                        for (unsigned c = CG_BLKIO; c < _CG_MAX; c++)
                                if (!ret[c] && has_word(controllers, v1_names[c]))
                                        ret[c] = strdup(path);
        }
}

static int write_file(const char *dir, const char *file, const char *value) {
        _cleanup_free_ char *path = NULL;
        _cleanup_close_ int fd = -EBADF;
        size_t n = strlen(value);

        if (asprintf(&path, "%s/%s", dir, file) < 0)
                return -ENOMEM;
        fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        if (write(fd, value, n) != (ssize_t) n)
                return -errno;
        return 0;
}

static char *read_file(const char *dir, const char *file) {
        _cleanup_free_ char *path = NULL;
        _cleanup_fclose_ FILE *f = NULL;
        char *buf;
        size_t n;

        if (asprintf(&path, "%s/%s", dir, file) < 0)
                return NULL;
        f = fopen(path, "re");
        if (!f)
                return NULL;
        buf = calloc(1, 65536);
        if (!buf)
                return NULL;
        n = fread(buf, 1, 65535, f);
        buf[n] = 0;
        return buf;
}

static bool file_exists(const char *dir, const char *file) {
        _cleanup_free_ char *path = NULL;

        return asprintf(&path, "%s/%s", dir, file) >= 0 && access(path, F_OK) >= 0;
}

/* The value after key in a "key value" file (memory.events, cpu.stat). */
static uint64_t keyed_value(const char *text, const char *key) {
        size_t n = strlen(key);

        for (const char *p = text; p && *p;) {
                if (strncmp(p, key, n) == 0 && p[n] == ' ')
                        return strtoull(p + n + 1, NULL, 10);
                p = strchr(p, '\n');
                if (p)
                        p++;
        }
        return 0;
}

static const char *const v2_names[_V2_MAX] = {
        [V2_IO] = "io",
        [V2_MEMORY] = "memory",
        [V2_PIDS] = "pids",
        [V2_CPU] = "cpu",
};

#define DELEGATE_HINT "run from a cgroup delegated to cowbox (systemd-run --scope -p Delegate=yes ...)"

/* Enables the v2 controllers the sandbox uses for the cgroups below dir
 * (name is dir as /proc/self/cgroup names it): one at a time, since the
 * kernel refuses a whole write for one controller it cannot enable. Says
 * in why[] why the first refusal of each was. */
static void enable_v2_controllers(const char *dir, const char *name, char *why[_V2_MAX]) {
        for (unsigned c = 0; c < _V2_MAX; c++) {
                char value[16];
                int r;

                snprintf(value, sizeof value, "+%s", v2_names[c]);
                r = write_file(dir, "cgroup.subtree_control", value);
                if (r >= 0 || why[c])
                        continue;
                /* The "no internal processes" rule: only a cgroup without
                 * processes (or the root) hands domain controllers down. */
                if (r == -EBUSY)
                        r = asprintf(&why[c], "cgroup v2: cannot enable %s below %s: the cgroup holds processes; "
                                     DELEGATE_HINT, v2_names[c], name);
                else if (r == -ENOENT)
                        r = asprintf(&why[c], "cgroup v2: %s is not handed down to %s by the cgroup above it; "
                                     DELEGATE_HINT, v2_names[c], name);
                else
                        r = asprintf(&why[c], "cgroup v2: cannot enable %s below %s: %s", v2_names[c], name,
                                     strerror(-r));
                if (r < 0)
                        why[c] = NULL;
        }
}

/* Whether the space-separated list holds word. */
static bool has_token(const char *list, const char *word) {
        size_t n = strlen(word);

        for (const char *p = list; p && *p; p += strcspn(p, " \n")) {
                p += strspn(p, " \n");
                if (strncmp(p, word, n) == 0 && (p[n] == 0 || p[n] == ' ' || p[n] == '\n'))
                        return true;
        }
        return false;
}

/* Why the sandbox's cgroups have no controller c, in either version. */
static char *host_lacks(const Cgroup *cg, CgroupV2Controller c) {
        char *text = NULL;

        if (cg->v2_why[c])
                return strdup(cg->v2_why[c]);
        if (cg->v2_offered[c])
                return strdup("the sandbox has no cgroup of its own in the cgroup v2 tree");
        if (asprintf(&text, "the host has no %s controller: %s, and no cgroup v1 hierarchy has it", v2_names[c],
                     cg->v2_tree ? "the cgroup v2 tree offers none (its root's cgroup.controllers)" :
                                   "there is no cgroup v2 tree") < 0)
                return NULL;
        return text;
}

/* Makes the directory path of a cgroup. One of that name left by a run
 * that died (the name holds its caller's PID) is removed first. */
static int make_cgroup_dir(const char *path, bool reuse) {
        if (mkdir(path, 0755) >= 0 || (errno == EEXIST && reuse))
                return 0;
        if (errno != EEXIST)
                return -errno;
        cgroup_remove_path(path);
        return mkdir(path, 0755) < 0 ? -errno : 0;
}

int cgroup_create(Cgroup *cg, const char *name) {
        char *mounts[_CG_MAX] = {}, *own[_CG_MAX] = {};
        Cgroup settings = {
                .reuse = cg->reuse,
                .v2_base = cg->v2_base,
                .before_make = cg->before_make,
                .before_make_userdata = cg->before_make_userdata,
        };
        const char *v2_base = cg->v2_base;
        int r = 0;

        *cg = settings;
        find_mounts(mounts);
        find_own(own);
        if (mounts[CG_UNIFIED]) {
                _cleanup_free_ char *offered = read_file(mounts[CG_UNIFIED], "cgroup.controllers");

                cg->v2_tree = true;
                for (unsigned v = 0; v < _V2_MAX; v++)
                        cg->v2_offered[v] = has_token(offered, v2_names[v]);
        }
        /* v2: below the cgroup delegated to us, if we were given one. */
        if (v2_base && own[CG_UNIFIED]) {
                free(own[CG_UNIFIED]);
                own[CG_UNIFIED] = strdup(v2_base);
        }

        for (unsigned c = 0; c < _CG_MAX; c++) {
                _cleanup_free_ char *parent = NULL;
                int k;

                if (!mounts[c] || !own[c])
                        continue;
                /* Controllers mounted together (cpu,cpuacct) share one
                 * hierarchy, and one directory. */
                for (unsigned d = 0; d < c && !cg->path[c]; d++)
                        if (cg->path[d] && mounts[d] && streq(mounts[d], mounts[c]) && streq(own[d], own[c]))
                                cg->path[c] = strdup(cg->path[d]);
                if (cg->path[c])
                        continue;
                if (asprintf(&parent, "%s%s/cowbox", mounts[c], streq(own[c], "/") ? "" : own[c]) < 0 ||
                    asprintf(&cg->path[c], "%s/%s", parent, name) < 0) {
                        cg->path[c] = NULL;
                        r = -ENOMEM;
                        break;
                }
                if (cg->before_make) {
                        r = cg->before_make(cg->path[c], cg->before_make_userdata);
                        if (r < 0) {
                                free(cg->path[c]);
                                cg->path[c] = NULL;
                                break;
                        }
                }
                k = mkdir(parent, 0755) < 0 && errno != EEXIST ? -errno : make_cgroup_dir(cg->path[c], cg->reuse);
                if (k < 0) {
                        if (c == CG_UNIFIED)
                                not_applied(cg, "cgroup v2: cannot make %s: %s", cg->path[c], strerror(-k));
                        free(cg->path[c]);
                        cg->path[c] = NULL;
                        continue;
                }
                /* v2: the controllers must be handed down to the new cgroup
                 * (the base's write fails while it holds processes, unless
                 * it is the root; then they are handed down or not, as
                 * whoever made it chose). */
                if (c == CG_UNIFIED) {
                        _cleanup_free_ char *own_dir = NULL, *controllers = NULL, *parent_name = NULL;

                        if (asprintf(&own_dir, "%s%s", mounts[c], streq(own[c], "/") ? "" : own[c]) >= 0)
                                enable_v2_controllers(own_dir, own[c], cg->v2_why);
                        if (asprintf(&parent_name, "%s/cowbox", streq(own[c], "/") ? "" : own[c]) >= 0)
                                enable_v2_controllers(parent, parent_name, cg->v2_why);
                        controllers = read_file(cg->path[c], "cgroup.controllers");
                        cg->v2_io = has_token(controllers, "io");
                        cg->v2_memory = has_token(controllers, "memory");
                        cg->v2_pids = has_token(controllers, "pids");
                        cg->v2_cpu = has_token(controllers, "cpu");
                        /* A reason is kept only for what the host's v2
                         * tree has and the sandbox's cgroup has not. */
                        for (unsigned v = 0; v < _V2_MAX; v++)
                                if (has_token(controllers, v2_names[v]) || !cg->v2_offered[v]) {
                                        free(cg->v2_why[v]);
                                        cg->v2_why[v] = NULL;
                                }
                }
        }
        for (unsigned c = 0; c < _CG_MAX; c++) {
                free(mounts[c]);
                free(own[c]);
        }
        return r;
}

static void apply_value(Cgroup *cg, const char *dir, const char *file, const char *value, const char *what) {
        int r = write_file(dir, file, value);

        if (r < 0)
                not_applied(cg, "%s: %s %s: %s", what, file, value, strerror(-r));
}

static void apply_io_v2(Cgroup *cg, const SandboxLimits *l, dev_t dev) {
        const char *dir = cg->path[CG_UNIFIED];
        char v[256];

        if (l->io_read_bps || l->io_write_bps || l->io_read_iops || l->io_write_iops) {
                snprintf(v, sizeof v, "%u:%u", major(dev), minor(dev));
#define ADD(key, val) if (val) snprintf(v + strlen(v), sizeof v - strlen(v), " " key "=%" PRIu64, (uint64_t) (val))
                ADD("rbps", l->io_read_bps);
                ADD("wbps", l->io_write_bps);
                ADD("riops", l->io_read_iops);
                ADD("wiops", l->io_write_iops);
#undef ADD
                apply_value(cg, dir, "io.max", v, "I/O limit");
        }
        if (l->io_weight) {
                snprintf(v, sizeof v, "default %" PRIu64, l->io_weight);
                apply_value(cg, dir, file_exists(dir, "io.weight") ? "io.weight" : "io.bfq.weight", v, "I/O weight");
        }
        if (l->io_latency_us) {
                snprintf(v, sizeof v, "%u:%u target=%" PRIu64, major(dev), minor(dev), l->io_latency_us);
                if (file_exists(dir, "io.latency"))
                        apply_value(cg, dir, "io.latency", v, "I/O latency");
                else
                        not_applied(cg, "I/O latency: this kernel has no io.latency (CONFIG_BLK_CGROUP_IOLATENCY)");
        }
}

static void apply_io_v1(Cgroup *cg, const SandboxLimits *l, dev_t dev) {
        const char *dir = cg->path[CG_BLKIO];
        static const struct { const char *file; size_t offset; } throttles[] = {
                { "blkio.throttle.read_bps_device", offsetof(SandboxLimits, io_read_bps) },
                { "blkio.throttle.write_bps_device", offsetof(SandboxLimits, io_write_bps) },
                { "blkio.throttle.read_iops_device", offsetof(SandboxLimits, io_read_iops) },
                { "blkio.throttle.write_iops_device", offsetof(SandboxLimits, io_write_iops) },
        };
        char v[128];

        for (size_t i = 0; i < sizeof throttles / sizeof throttles[0]; i++) {
                uint64_t value = *(const uint64_t *) ((const char *) l + throttles[i].offset);

                if (!value)
                        continue;
                snprintf(v, sizeof v, "%u:%u %" PRIu64, major(dev), minor(dev), value);
                apply_value(cg, dir, throttles[i].file, v, "I/O limit");
        }
        if (l->io_weight) {
                const char *file = file_exists(dir, "blkio.weight") ? "blkio.weight" : "blkio.bfq.weight";

                snprintf(v, sizeof v, "%" PRIu64, MIN(l->io_weight, (uint64_t) 1000));
                if (!file_exists(dir, file))
                        not_applied(cg, "I/O weight: neither blkio.weight nor blkio.bfq.weight exists");
                else {
                        char queue[64];
                        char *scheduler;

                        apply_value(cg, dir, file, v, "I/O weight");
                        /* BFQ's weight counts only where BFQ schedules. */
                        snprintf(queue, sizeof queue, "/sys/dev/block/%u:%u/queue", major(dev), minor(dev));
                        scheduler = read_file(queue, "scheduler");
                        if (streq(file, "blkio.bfq.weight") && scheduler && !strstr(scheduler, "[bfq]"))
                                not_applied(cg, "I/O weight: set, but the disk's scheduler is not bfq, so it "
                                            "has no effect (echo bfq > %s/scheduler)", queue);
                        free(scheduler);
                }
        }
        if (l->io_latency_us) {
                if (cg->v2_why[V2_IO])
                        not_applied(cg, "I/O latency: needs the io controller of cgroup v2: %s", cg->v2_why[V2_IO]);
                else
                        not_applied(cg, "I/O latency: needs the io controller of cgroup v2, which this host lacks");
        }
}

/* A limit the controller c would have held, and why it did not. */
static void not_held(Cgroup *cg, const char *what, CgroupV2Controller c) {
        _cleanup_free_ char *why = host_lacks(cg, c);

        not_applied(cg, "%s: %s", what, why ?: strerror(ENOMEM));
}

void cgroup_apply(Cgroup *cg, const SandboxLimits *l, dev_t dev) {
        bool io = l->io_read_bps || l->io_write_bps || l->io_read_iops || l->io_write_iops || l->io_weight ||
                  l->io_latency_us;
        char v[64];

        if (io && dev == 0)
                not_applied(cg, "I/O limits: the store is on no block device");
        else if (io && cg->v2_io) {
                cg->io_version = 2;
                apply_io_v2(cg, l, dev);
        } else if (io && cg->path[CG_BLKIO]) {
                cg->io_version = 1;
                apply_io_v1(cg, l, dev);
        } else if (io)
                not_held(cg, "I/O limits", V2_IO);
        if (!io)
                cg->io_version = cg->v2_io ? 2 : cg->path[CG_BLKIO] ? 1 : 0;

        if (l->memory_max) {
                snprintf(v, sizeof v, "%" PRIu64, l->memory_max);
                if (cg->v2_memory)
                        apply_value(cg, cg->path[CG_UNIFIED], "memory.max", v, "memory limit");
                else if (cg->path[CG_MEMORY]) {
                        apply_value(cg, cg->path[CG_MEMORY], "memory.limit_in_bytes", v, "memory limit");
                        /* Swap counts too, where the host accounts it. */
                        if (file_exists(cg->path[CG_MEMORY], "memory.memsw.limit_in_bytes"))
                                (void) write_file(cg->path[CG_MEMORY], "memory.memsw.limit_in_bytes", v);
                } else
                        not_held(cg, "memory limit", V2_MEMORY);
        }
        if (l->pids_max) {
                /* Past the most PIDs the kernel ever gives out, a limit
                 * is none; pids.max refuses such a number. */
                if (l->pids_max > PIDS_LIMIT_MAX)
                        snprintf(v, sizeof v, "max");
                else
                        snprintf(v, sizeof v, "%" PRIu64, l->pids_max);
                if (cg->v2_pids)
                        apply_value(cg, cg->path[CG_UNIFIED], "pids.max", v, "process limit");
                else if (cg->path[CG_PIDS])
                        apply_value(cg, cg->path[CG_PIDS], "pids.max", v, "process limit");
                else
                        not_held(cg, "process limit", V2_PIDS);
        }
        if (l->cpu_percent > UINT64_MAX / 1000)
                not_applied(cg, "CPU limit: %" PRIu64 "%% is more than any host has", l->cpu_percent);
        else if (l->cpu_percent) {
                if (cg->v2_cpu) {
                        snprintf(v, sizeof v, "%" PRIu64 " 100000", l->cpu_percent * 1000);
                        apply_value(cg, cg->path[CG_UNIFIED], "cpu.max", v, "CPU limit");
                } else if (cg->path[CG_CPU]) {
                        apply_value(cg, cg->path[CG_CPU], "cpu.cfs_period_us", "100000", "CPU limit");
                        snprintf(v, sizeof v, "%" PRIu64, l->cpu_percent * 1000);
                        apply_value(cg, cg->path[CG_CPU], "cpu.cfs_quota_us", v, "CPU limit");
                } else
                        not_held(cg, "CPU limit", V2_CPU);
        }
}

int cgroup_attach(const Cgroup *cg, pid_t pid) {
        char v[32];
        int r = 0;

        snprintf(v, sizeof v, "%d", (int) pid);
        for (unsigned c = 0; c < _CG_MAX; c++)
                if (cg->path[c]) {
                        int k = write_file(cg->path[c], "cgroup.procs", v);

                        if (k < 0 && r == 0)
                                r = k;
                }
        return r;
}

static uint64_t io_v1_bytes(const char *text, dev_t dev, const char *op) {
        char key[64];

        snprintf(key, sizeof key, "%u:%u %s", major(dev), minor(dev), op);
        return keyed_value(text, key);
}

static uint64_t io_v2_bytes(const char *text, dev_t dev, const char *key) {
        char prefix[32];
        const char *line, *field;

        snprintf(prefix, sizeof prefix, "%u:%u ", major(dev), minor(dev));
        for (line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
                if (strncmp(line, prefix, strlen(prefix)) == 0) {
                        field = strstr(line, key);
                        return field ? strtoull(field + strlen(key), NULL, 10) : 0;
                }
        return 0;
}

void cgroup_collect(const Cgroup *cg, dev_t dev, SandboxResult *ret) {
        const char *v2 = cg->path[CG_UNIFIED];
        char *text;

        ret->cgroup_version = cg->io_version;
        if (cg->v2_memory) {
                text = read_file(v2, "memory.peak");
                ret->memory_peak = text ? strtoull(text, NULL, 10) : 0;
                free(text);
                text = read_file(v2, "memory.events");
                ret->oom_killed = keyed_value(text, "oom_kill") > 0;
                free(text);
        } else if (cg->path[CG_MEMORY]) {
                text = read_file(cg->path[CG_MEMORY], "memory.max_usage_in_bytes");
                ret->memory_peak = text ? strtoull(text, NULL, 10) : 0;
                free(text);
                text = read_file(cg->path[CG_MEMORY], "memory.oom_control");
                ret->oom_killed = keyed_value(text, "oom_kill") > 0;
                free(text);
        }
        text = read_file(cg->v2_pids ? v2 : cg->path[CG_PIDS] ? cg->path[CG_PIDS] : "/nonexistent", "pids.events");
        ret->pids_limit_hit = keyed_value(text, "max") > 0;
        free(text);
        if (cg->v2_cpu) {
                text = read_file(v2, "cpu.stat");
                ret->cpu_usec = keyed_value(text, "usage_usec");
                free(text);
        } else if (cg->path[CG_CPUACCT]) {
                text = read_file(cg->path[CG_CPUACCT], "cpuacct.usage");
                ret->cpu_usec = text ? strtoull(text, NULL, 10) / 1000 : 0;
                free(text);
        }
        if (dev != 0 && cg->v2_io) {
                text = read_file(v2, "io.stat");
                ret->io_read_bytes = io_v2_bytes(text, dev, "rbytes=");
                ret->io_write_bytes = io_v2_bytes(text, dev, "wbytes=");
                free(text);
        } else if (dev != 0 && cg->path[CG_BLKIO]) {
                text = read_file(cg->path[CG_BLKIO], "blkio.throttle.io_service_bytes_recursive");
                if (!text)
                        text = read_file(cg->path[CG_BLKIO], "blkio.throttle.io_service_bytes");
                ret->io_read_bytes = io_v1_bytes(text, dev, "Read");
                ret->io_write_bytes = io_v1_bytes(text, dev, "Write");
                free(text);
        }
}

/* Kills every process of the cgroup until none is left. */
static void kill_all(const char *dir) {
        for (unsigned round = 0; round < 200; round++) {
                char *procs = read_file(dir, "cgroup.procs");
                bool any = false;

                for (char *p = procs; p && *p;) {
                        pid_t pid = (pid_t) strtol(p, &p, 10);

                        if (pid > 0) {
                                (void) kill(pid, SIGKILL);
                                any = true;
                        }
                        while (*p == '\n')
                                p++;
                }
                free(procs);
                if (!any)
                        return;
                (void) usleep(10000);
        }
}

void cgroup_remove_path(const char *path) {
        if (file_exists(path, "cgroup.kill"))
                (void) write_file(path, "cgroup.kill", "1");
        kill_all(path);
        for (unsigned i = 0; i < 100 && rmdir(path) < 0 && errno == EBUSY; i++)
                (void) usleep(10000);
}

void cgroup_destroy(Cgroup *cg) {
        for (unsigned c = 0; c < _CG_MAX; c++) {
                if (!cg->path[c])
                        continue;
                /* A shared hierarchy's directory went with the first. */
                cgroup_remove_path(cg->path[c]);
                for (unsigned d = c + 1; d < _CG_MAX; d++)
                        if (cg->path[d] && streq(cg->path[d], cg->path[c])) {
                                free(cg->path[d]);
                                cg->path[d] = NULL;
                        }
                free(cg->path[c]);
                cg->path[c] = NULL;
        }
        for (size_t i = 0; i < cg->n_not_applied; i++)
                free(cg->not_applied[i]);
        free(cg->not_applied);
        cg->not_applied = NULL;
        cg->n_not_applied = 0;
        for (unsigned c = 0; c < _V2_MAX; c++) {
                free(cg->v2_why[c]);
                cg->v2_why[c] = NULL;
        }
}

/* The block device that the file system holding path was mounted from, as
 * mountinfo names it; 0 if it names none (tmpfs, overlayfs, NFS). For
 * btrfs, whose files' st_dev is a number of its own and no device's: of a
 * btrfs on several devices, the one it was mounted by. */
static dev_t mount_source_of(const char *path) {
        _cleanup_fclose_ FILE *f = NULL;
        struct statx stx;
        char line[8192];

        if (statx(AT_FDCWD, path, 0, STATX_MNT_ID, &stx) < 0 || !(stx.stx_mask & STATX_MNT_ID))
                return 0;
        f = fopen("/proc/self/mountinfo", "re");
        while (f && fgets(line, sizeof line, f)) {
                char source[PATH_MAX];
                const char *dash = strstr(line, " - ");
                unsigned long long id;
                struct stat st;

                if (!dash || sscanf(line, "%llu", &id) != 1 || id != stx.stx_mnt_id ||
                    sscanf(dash + 3, "%*s %4095s", source) != 1)
                        continue;
                mountinfo_unescape(source);
                return stat(source, &st) >= 0 && S_ISBLK(st.st_mode) ? st.st_rdev : 0;
        }
        return 0;
}

dev_t block_device_of(const char *path) {
        char link[PATH_MAX], sys[PATH_MAX + 32], *slash;
        unsigned maj, min;
        struct stat st;
        ssize_t n;
        char *text;
        dev_t dev;

        if (stat(path, &st) < 0)
                return 0;
        dev = major(st.st_dev) != 0 ? st.st_dev : mount_source_of(path);
        if (major(dev) == 0)
                return 0;
        snprintf(sys, sizeof sys, "/sys/dev/block/%u:%u", major(dev), minor(dev));
        if (!file_exists(sys, "partition"))
                return dev;
        /* A partition: its disk is the directory above it. */
        n = readlink(sys, link, sizeof link - 1);
        if (n < 0)
                return dev;
        link[n] = 0;
        slash = strrchr(link, '/');
        if (!slash)
                return dev;
        *slash = 0;
        snprintf(sys, sizeof sys, "/sys/dev/block/%s", link);
        text = read_file(sys, "dev");
        if (!text || sscanf(text, "%u:%u", &maj, &min) != 2) {
                free(text);
                return dev;
        }
        free(text);
        return makedev(maj, min);
}

int runtime_enter_cgroup(const char *name, const char *cgroup_base, const SandboxLimits *limits, const char *path,
                         char ***ret_not_applied) {
        Cgroup cg = { .reuse = true, .v2_base = cgroup_base };
        int r;

        r = cgroup_create(&cg, name);
        if (r >= 0) {
                cgroup_apply(&cg, limits, block_device_of(path));
                r = cgroup_attach(&cg, getpid());
        }
        if (ret_not_applied) {
                *ret_not_applied = cg.not_applied;
                cg.not_applied = NULL;
        }
        for (size_t i = 0; cg.not_applied && i < cg.n_not_applied; i++)
                free(cg.not_applied[i]);
        free(cg.not_applied);
        for (unsigned c = 0; c < _CG_MAX; c++)
                free(cg.path[c]);
        for (unsigned c = 0; c < _V2_MAX; c++)
                free(cg.v2_why[c]);
        return r;
}

/* Whether systemd marked the cgroup dir as delegated to the processes in
 * it: trusted.delegate (the system's manager; only root reads it), else
 * user.delegate (a user's manager). */
static bool cgroup_is_delegated(const char *dir) {
        FOREACH_STRING(name, "trusted.delegate", "user.delegate") {
                char value[8] = {};

                if (getxattr(dir, name, value, sizeof value - 1) > 0)
                        return streq(value, "1") || streq(value, "yes") || streq(value, "true");
        }
        return false;
}

int runtime_cgroup_delegate(char **ret_base) {
        char *mounts[_CG_MAX] = {}, *own[_CG_MAX] = {};
        _cleanup_free_ char *dir = NULL, *leaf = NULL;
        char pid[32];
        int r = 0;

        *ret_base = NULL;
        find_mounts(mounts);
        find_own(own);
        if (!mounts[CG_UNIFIED] || !own[CG_UNIFIED] || streq(own[CG_UNIFIED], "/"))
                goto out;
        if (asprintf(&dir, "%s%s", mounts[CG_UNIFIED], own[CG_UNIFIED]) < 0) {
                r = -ENOMEM;
                goto out;
        }
        if (!cgroup_is_delegated(dir)) {
                char *slash = strrchr(dir, '/');

                /* In a leaf of the delegated cgroup already. */
                *slash = 0;
                if (cgroup_is_delegated(dir)) {
                        size_t n = (size_t) (strrchr(own[CG_UNIFIED], '/') - own[CG_UNIFIED]);

                        *ret_base = n > 0 ? strndup(own[CG_UNIFIED], n) : strdup("/");
                        r = *ret_base ? 0 : -ENOMEM;
                }
                goto out;
        }
        /* Ours to organize: systemd leaves what is below a delegated
         * cgroup to the processes in it, and advises a leaf for the
         * manager itself, so that the cgroup may hand controllers down to
         * the others it makes. */
        if (asprintf(&leaf, "%s/" RUNTIME_CGROUP_LEAF, dir) < 0) {
                r = -ENOMEM;
                goto out;
        }
        snprintf(pid, sizeof pid, "%d", (int) getpid());
        if (mkdir(leaf, 0755) < 0 && errno != EEXIST)
                r = -errno;
        else
                r = write_file(leaf, "cgroup.procs", pid);
        if (r >= 0) {
                *ret_base = strdup(own[CG_UNIFIED]);
                r = *ret_base ? 1 : -ENOMEM;
        }
out:
        for (unsigned c = 0; c < _CG_MAX; c++) {
                free(mounts[c]);
                free(own[c]);
        }
        return r;
}
