/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* RunTask: a task in a sandbox made from a new writable snapshot, as a
 * job; its output and its report are the job's result. */

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
#include "cleanup.h"
#include "manager.h"
#include "process-util.h"
#include "runtime.h"
#include "string-util.h"

#define _cleanup_json_ _cleanup_(json_decrefp)
#define ARGS_MAX 256
#define OUTPUT_MAX (64 * 1024)

typedef struct TaskWork {
        char *source;
        char **argv;
        SandboxOptions opts;
        char *workdir, *name, *hostname, *cwd;
} TaskWork;

static void task_work_free(void *userdata) {
        TaskWork *w = userdata;

        for (char **a = w->argv; a && *a; a++)
                free(*a);
        free(w->argv);
        free(w->source);
        free(w->workdir);
        free(w->name);
        free(w->hostname);
        free(w->cwd);
        free(w);
}

static volatile int cancelled;

static void on_term(int sig) {
        cancelled = 1;
}

/* The first OUTPUT_MAX bytes of a file, as a JSON string: cut before a
 * character the limit would split, each invalid sequence of bytes (JSON
 * holds only UTF-8) replaced by U+FFFD. */
static json_t *read_output(int fd) {
        _cleanup_free_ unsigned char *buf = malloc(OUTPUT_MAX + 1);
        ssize_t n;

        if (!buf)
                return json_string("");
        n = pread(fd, buf, OUTPUT_MAX + 1, 0);
        if (n < 0)
                n = 0;
        if (n > OUTPUT_MAX) {
                /* Cut: a character the cut splits goes whole. */
                n = OUTPUT_MAX;
                for (ssize_t i = n - 1; i >= 0 && i >= n - 3; i--) {
                        if ((buf[i] & 0xC0) == 0x80)
                                continue;
                        if (buf[i] >= 0xC2 && buf[i] <= 0xF4 &&
                            api_utf8_char(buf + i, (size_t) (n - i)) == -(int) (n - i))
                                n = i;
                        break;
                }
        }
        return api_json_stringn_lossy((const char *) buf, (size_t) n) ?: json_string("");
}

/* The worker's PID is in the name: a worker killed before it removed the
 * file is known by it. */
#define OUTPUT_PREFIX "output-"

static int temp_output(const char *store_path, char **ret_path) {
        _cleanup_free_ char *dir = NULL;
        int fd;

        if (asprintf(&dir, "%s-sandboxes", store_path) < 0 ||
            asprintf(ret_path, "%s/" OUTPUT_PREFIX "%d-XXXXXX", dir, (int) getpid()) < 0)
                return -ENOMEM;
        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
                return -errno;
        fd = mkostemp(*ret_path, O_CLOEXEC);
        return fd < 0 ? -errno : fd;
}

void task_remove_stale_outputs(const char *store_path) {
        _cleanup_free_ char *path = NULL;
        _cleanup_closedir_ DIR *dir = NULL;
        struct dirent *de;

        if (asprintf(&path, "%s-sandboxes", store_path) < 0)
                return;
        dir = opendir(path);
        while (dir && (de = readdir(dir))) {
                const char *p = de->d_name + strlen(OUTPUT_PREFIX);
                char *end;
                long pid;

                if (!startswith(de->d_name, OUTPUT_PREFIX) || !isdigit((unsigned char) *p))
                        continue;
                pid = strtol(p, &end, 10);
                if (*end != '-' || strlen(end + 1) != 6 || pid <= 0 || pid > INT_MAX)
                        continue;
                if (process_is_exiting((pid_t) pid))
                        (void) unlinkat(dirfd(dir), de->d_name, 0);
        }
}

static json_t *run_work(Store *s, void *userdata, int *ret_error, char **ret_error_text,
                        void (*progress)(uint64_t, uint64_t)) {
        _cleanup_free_ char *out_path = NULL, *err_path = NULL;
        _cleanup_close_ int out = -EBADF, err = -EBADF;
        TaskWork *w = userdata;
        SandboxResult result = {};
        char error[512];
        json_t *doc, *list;
        int r;

        (void) signal(SIGTERM, on_term);
        out = temp_output(store_path(s), &out_path);
        err = out >= 0 ? temp_output(store_path(s), &err_path) : out;
        if (out < 0 || err < 0) {
                *ret_error = out < 0 ? out : err;
                return NULL;
        }
        w->opts.stdout_path = out_path;
        w->opts.stderr_path = err_path;
        w->opts.cancel = &cancelled;
        r = sandbox_run(s, &w->opts, &result, error, sizeof error);
        (void) unlink(out_path);
        (void) unlink(err_path);
        if (r < 0) {
                *ret_error = r;
                *ret_error_text = strdup(error);
                sandbox_result_clear(&result);
                return NULL;
        }
        list = json_array();
        for (char **p = result.not_applied; p && *p; p++)
                json_array_append_new(list, json_string(*p));
        doc = json_pack("{s:s?, s:i, s:i, s:b, s:b, s:b, s:b, s:I, s:I, s:I, s:I, s:i, s:o, s:o, s:o}",
                        "snapshot", result.snapshot,
                        "exit_status", result.exit_status,
                        "signal", result.signal,
                        "timed_out", result.timed_out,
                        "cancelled", result.cancelled,
                        "oom_killed", result.oom_killed,
                        "pids_limit_hit", result.pids_limit_hit,
                        "cpu_usec", (json_int_t) result.cpu_usec,
                        "memory_peak_bytes", (json_int_t) result.memory_peak,
                        "io_read_bytes", (json_int_t) result.io_read_bytes,
                        "io_write_bytes", (json_int_t) result.io_write_bytes,
                        "cgroup_version", (int) result.cgroup_version,
                        "not_applied", list,
                        "stdout", read_output(out),
                        "stderr", read_output(err));
        sandbox_result_clear(&result);
        return doc;
}

static char *dup_option(json_t *opts, const char *key) {
        const char *v = api_option_string(opts, key, NULL);

        return v ? strdup(v) : NULL;
}

static const ApiOption task_options[] = {
        { "workdir", 's' }, { "name", 's' }, { "hostname", 's' }, { "cwd", 's' },
        { "keep", 'b' }, { "host_network", 'b' }, { "timeout_sec", 'u' }, { "uid", 'i' }, { "gid", 'i' },
        { "memory_max", 'u' }, { "disk_max", 'u' }, { "pids_max", 'u' }, { "cpu_percent", 'u' },
        { "io_read_bps", 'u' }, { "io_write_bps", 'u' }, { "io_read_iops", 'u' }, { "io_write_iops", 'u' },
        { "io_weight", 'u' }, { "io_latency_us", 'u' }, { "userns_base", 'i' }, { "userns_size", 'i' }, {}
};

/* Absolute, without '.' or '..' components: what the task sees is the
 * path it names, whatever the directories under it. */
static bool path_is_plain_absolute(const char *path) {
        return path[0] == '/' && !path_has_dot_component(path, true);
}

static uint64_t cpu_percent_max(void) {
        long n = sysconf(_SC_NPROCESSORS_CONF);

        return 100 * (uint64_t) (n > 0 ? n : 1);
}

int task_check(const char *source, char **argv, const char *options, json_t **ret_opts, sd_bus_error *error) {
        json_t *opts = NULL;
        const char *workdir, *name, *hostname, *cwd;
        uint64_t userns_base;
        size_t n = 0;
        int r;

        for (; argv && argv[n]; n++)
                ;
        /* Not an image being received: what it holds is not whole yet. */
        r = manager_check_name(source, error);
        if (r < 0)
                return r;
        if (n == 0 || n > ARGS_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Give a command of 1 to %d words.",
                                         ARGS_MAX);
        r = api_parse_options(options, task_options, &opts, error);
        if (r < 0)
                return r;
        workdir = api_option_string(opts, "workdir", NULL);
        cwd = api_option_string(opts, "cwd", NULL);
        userns_base = api_option_uint(opts, "userns_base", 0);
        name = api_option_string(opts, "name", NULL);
        hostname = api_option_string(opts, "hostname", NULL);
        if (name && manager_check_new_name(name, error) < 0)
                r = -EINVAL;
        else if (hostname && (strlen(hostname) == 0 || strlen(hostname) > HOST_NAME_MAX))
                r = sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Option \"hostname\" must be 1 to %d bytes.",
                                      HOST_NAME_MAX);
        else if (workdir && (!path_is_plain_absolute(workdir) || path_is_root(workdir)))
                /* The runtime refuses it too, but only once the job runs. */
                r = sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Option \"workdir\" must be an absolute path "
                                      "without '.' or '..' components, and not '/'.");
        else if (cwd && !path_is_plain_absolute(cwd))
                r = sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Option \"cwd\" must be an absolute path "
                                      "without '.' or '..' components.");
        else if (userns_base > 0 && api_option_uint(opts, "userns_size", 1) == 0)
                /* No IDs to map would be no user namespace: the task would run as the host's root. */
                r = sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Option \"userns_size\" must be at least 1.");
        else if (userns_base > 0 && userns_base + api_option_uint(opts, "userns_size", 65536) > UINT32_MAX)
                /* The last ID mapped must be below (uid_t) -1. */
                r = sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Options \"userns_base\" and \"userns_size\" "
                                      "(65536 by default) must name IDs below 2^32 - 1.");
        else if (api_option_uint(opts, "cpu_percent", 0) > cpu_percent_max())
                /* More than every CPU means nothing, and the cgroup's quota
                 * (the percent times 1000 µs) must not overflow. */
                r = sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Option \"cpu_percent\" must be at most %" PRIu64
                                      " (100 for each of the host's CPUs); 0 means no limit.", cpu_percent_max());
        else if (api_option_uint(opts, "timeout_sec", 0) > 365 * 24 * 3600)
                r = sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Option \"timeout_sec\" is too large.");
        if (r < 0) {
                json_decref(opts);
                return r;
        }
        *ret_opts = opts;
        return 0;
}

int task_start(Manager *m, const char *source, char *const *argv, json_t *opts, bool in_source, Job **ret) {
        TaskWork *w;
        size_t n = 0;

        for (; argv[n]; n++)
                ;
        w = calloc(1, sizeof *w);
        if (!w)
                return -ENOMEM;
        w->argv = calloc(n + 1, sizeof *w->argv);
        for (size_t i = 0; w->argv && i < n; i++)
                w->argv[i] = strdup(argv[i]);
        w->source = strdup(source);
        w->workdir = dup_option(opts, "workdir");
        w->name = dup_option(opts, "name");
        w->hostname = dup_option(opts, "hostname");
        w->cwd = dup_option(opts, "cwd");
        w->opts = (SandboxOptions) {
                .source = w->source,
                .in_source = in_source,
                .name = w->name,
                .shape = w->workdir ? SANDBOX_WORKDIR : SANDBOX_ROOT,
                .workdir = w->workdir,
                .argv = w->argv,
                .cwd = w->cwd,
                .hostname = w->hostname,
                .uid = (uid_t) api_option_uint(opts, "uid", 0),
                .gid = (gid_t) api_option_uint(opts, "gid", api_option_uint(opts, "uid", 0)),
                .host_network = api_option_bool(opts, "host_network", false),
                .userns_base = (uid_t) api_option_uint(opts, "userns_base", 0),
                .userns_size = api_option_uint(opts, "userns_base", 0) > 0 ?
                               (uint32_t) api_option_uint(opts, "userns_size", 65536) : 0,
                .keep = api_option_bool(opts, "keep", false),
                .disk_max = api_option_uint(opts, "disk_max", 0),
                .timeout_usec = api_option_uint(opts, "timeout_sec", 0) * 1000000,
                .limits = {
                        .memory_max = api_option_uint(opts, "memory_max", 0),
                        .pids_max = api_option_uint(opts, "pids_max", 0),
                        .cpu_percent = api_option_uint(opts, "cpu_percent", 0),
                        .io_read_bps = api_option_uint(opts, "io_read_bps", 0),
                        .io_write_bps = api_option_uint(opts, "io_write_bps", 0),
                        .io_read_iops = api_option_uint(opts, "io_read_iops", 0),
                        .io_write_iops = api_option_uint(opts, "io_write_iops", 0),
                        .io_weight = api_option_uint(opts, "io_weight", 0),
                        .io_latency_us = api_option_uint(opts, "io_latency_us", 0),
                },
                .cgroup_base = m->cgroup_base,
        };
        if (!w->source || !w->argv || (n > 0 && !w->argv[n - 1])) {
                task_work_free(w);
                return -ENOMEM;
        }
        return job_start(m, JOB_RUN, source, run_work, w, task_work_free, ret);
}

int method_run_task(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ json_t *opts = NULL;
        Manager *m = userdata;
        const char *source, *options;
        char **argv = NULL;
        Job *j = NULL;
        int r;

        r = sd_bus_message_read(message, "s", &source);
        if (r >= 0)
                r = sd_bus_message_read_strv(message, &argv);
        if (r >= 0)
                r = sd_bus_message_read(message, "s", &options);
        if (r >= 0)
                r = task_check(source, argv, options, &opts, error);
        if (r >= 0)
                r = manager_check_caller(message, error);
        if (r >= 0) {
                /* A missing image is refused at the call, as CreateSandbox
                 * refuses it, not by a job that fails at once. */
                StoreSubvolumeInfo info = {};

                r = store_subvolume_show(m->store, source, &info);
                store_subvolume_info_clear(&info);
                if (r < 0)
                        r = store_error_reply(r, source, error);
        }
        if (r >= 0) {
                r = task_start(m, source, argv, opts, false, &j);
                /* A task belongs to its caller: when the caller is gone, the
                 * task and its snapshot go too. */
                if (r >= 0)
                        (void) job_watch_owner(j, sd_bus_message_get_sender(message));
                r = reply_job(message, m, r, j, error);
        }
        for (char **a = argv; a && *a; a++)
                free(*a);
        free(argv);
        return r;
}
