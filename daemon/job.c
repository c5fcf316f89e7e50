/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * Jobs: long work (receive, send, scrub, reap) runs in a forked worker, so
 * that the daemon keeps answering and a cancel is a signal. The worker
 * opens the store anew and reports over a pipe; the daemon turns that into
 * the job's properties and, when the worker exits, into JobRemoved.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "cleanup.h"
#include "manager.h"
#include "time-util.h"

#define CANCEL_KILL_USEC (5 * 1000 * 1000)
#define PROGRESS_MIN_INTERVAL_USEC (200 * 1000)
/* A result holds a task's output (64 KiB, up to six times that escaped) or
 * scrub's list of damaged files: far below this, which only bounds what a
 * broken worker can make the daemon hold. */
#define JOB_LINE_MAX (16U * 1024 * 1024)
#define JOB_READ_CHUNK 4096U

static const char *const job_type_names[_JOB_TYPE_MAX] = {
        [JOB_RECEIVE] = "receive",
        [JOB_SEND] = "send",
        [JOB_SCRUB] = "scrub",
        [JOB_REAP] = "reap",
        [JOB_RUN] = "run",
};

const char *job_type_to_string(JobType t) {
        return t < _JOB_TYPE_MAX ? job_type_names[t] : "unknown";
}

const char *job_state_to_string(JobState s) {
        switch (s) {
        case JOB_RUNNING:   return "running";
        case JOB_DONE:      return "done";
        case JOB_FAILED:    return "failed";
        default:            return "cancelled";
        }
}

json_t *job_to_json(const Job *j) {
        return json_pack("{s:i, s:s, s:s, s:s, s:I, s:I}",
                         "id", (int) j->id,
                         "type", job_type_to_string(j->type),
                         "target", j->target ? j->target : "",
                         "state", job_state_to_string(j->state),
                         "bytes_done", (json_int_t) j->bytes_done,
                         "bytes_total", (json_int_t) j->bytes_total);
}

Job *manager_find_job(Manager *m, uint32_t id) {
        for (Job *j = m->jobs; j; j = j->next)
                if (j->id == id)
                        return j;
        return NULL;
}

static bool job_type_running(Manager *m, JobType type) {
        for (Job *j = m->jobs; j; j = j->next)
                if (j->type == type && j->state == JOB_RUNNING)
                        return true;
        return false;
}

static Job *job_free(Job *j) {
        if (!j)
                return NULL;
        sd_event_source_disable_unref(j->pipe_source);
        sd_event_source_disable_unref(j->child_source);
        sd_event_source_disable_unref(j->kill_timer);
        sd_bus_slot_unref(j->owner_watch);
        if (j->pipe_fd >= 0)
                close(j->pipe_fd);
        free(j->target);
        free(j->line);
        free(j->error_text);
        free(j->result);
        free(j);
        return NULL;
}

static void job_unlink(Manager *m, Job *j) {
        for (Job **p = &m->jobs; *p; p = &(*p)->next)
                if (*p == j) {
                        *p = j->next;
                        m->n_jobs--;
                        return;
                }
}

/* ---- the worker's side ---- */

static int worker_fd = -1;

static void worker_write(const char *line) {
        size_t n = strlen(line);

        while (n > 0) {
                ssize_t k = write(worker_fd, line, n);

                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        _exit(EXIT_FAILURE);    /* the daemon is gone */
                line += k;
                n -= (size_t) k;
        }
}

static void worker_progress(uint64_t done, uint64_t total) {
        char line[64];

        snprintf(line, sizeof line, "progress %" PRIu64 " %" PRIu64 "\n", done, total);
        worker_write(line);
}

_noreturn_
static void worker_main(Manager *m, job_work_t work, void *userdata) {
        _cleanup_free_ char *text = NULL, *error_text = NULL, *line = NULL;
        Store *s = NULL;
        json_t *result;
        int r, error = 0;

        r = store_open(m->store_path, &s);
        if (r < 0) {
                error = r;
                result = NULL;
        } else
                result = work(s, userdata, &error, &error_text, worker_progress);
        store_close(s);

        if (error < 0) {
                if (asprintf(&line, "error %d %s\n", -error,
                             error_text ? error_text : strerror(-error)) < 0)
                        _exit(EXIT_FAILURE);
                /* One line: a message never holds a newline of its own. */
                for (char *p = line; p[1]; p++)
                        if (*p == '\n')
                                *p = ' ';
                worker_write(line);
                _exit(EXIT_FAILURE);
        }
        text = result ? json_dumps(result, JSON_COMPACT) : strdup("{}");
        if (!text || asprintf(&line, "result %s\n", text) < 0)
                _exit(EXIT_FAILURE);
        worker_write(line);
        _exit(EXIT_SUCCESS);
}

/* ---- the daemon's side ---- */

static void job_parse_line(Job *j, char *line) {
        if (strncmp(line, "progress ", 9) == 0) {
                if (sscanf(line + 9, "%" SCNu64 " %" SCNu64, &j->bytes_done, &j->bytes_total) != 2)
                        return;
                if (ratelimit_due(&j->progress_usec, PROGRESS_MIN_INTERVAL_USEC, false))
                        (void) job_send_changed(j);
        } else if (strncmp(line, "result ", 7) == 0) {
                free(j->result);
                j->result = strdup(line + 7);
        } else if (strncmp(line, "error ", 6) == 0) {
                char *text = NULL;
                long e = strtol(line + 6, &text, 10);

                j->error = e > 0 && e < 4096 ? (int) -e : -EIO;
                free(j->error_text);
                /* It goes out in JobRemoved's JSON: a message that quotes
                 * a stream's path may hold bytes that are not UTF-8. */
                j->error_text = api_utf8_lossy(text && *text == ' ' ? text + 1 : "the job failed");
        }
}

/* Makes room to read another chunk; false when the line is too long. */
static bool job_line_reserve(Job *j) {
        size_t size;
        char *p;

        if (j->line_size - j->line_len > JOB_READ_CHUNK)
                return true;
        if (j->line_size >= JOB_LINE_MAX)
                return false;
        size = MAX(j->line_size * 2, 2 * JOB_READ_CHUNK);
        p = realloc(j->line, size);
        if (!p)
                return false;
        j->line = p;
        j->line_size = size;
        return true;
}

/* A line too long to hold is skipped to its end. Were it the result, the
 * job fails saying so, rather than losing it quietly or reading its tail
 * as a line of its own. */
static void job_drop_line(Job *j) {
        if (strncmp(j->line, "result ", 7) == 0 || strncmp(j->line, "error ", 6) == 0) {
                j->error = -E2BIG;
                free(j->error_text);
                j->error_text = strdup("the job's report was too long to keep");
        }
        j->line_len = 0;
        j->line_dropped = true;
}

static int on_pipe(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Job *j = userdata;
        char *start;
        ssize_t k;

        if (!job_line_reserve(j))
                job_drop_line(j);
        k = read(fd, j->line + j->line_len, j->line_size - 1 - j->line_len);
        if (k <= 0) {
                if (k < 0 && errno == EINTR)
                        return 0;
                j->pipe_source = sd_event_source_disable_unref(j->pipe_source);
                return 0;
        }
        j->line_len += (size_t) k;
        j->line[j->line_len] = 0;

        start = j->line;
        for (;;) {
                char *nl = memchr(start, '\n', j->line_len - (size_t) (start - j->line));

                if (!nl)
                        break;
                *nl = 0;
                if (j->line_dropped)
                        j->line_dropped = false;
                else
                        job_parse_line(j, start);
                start = nl + 1;
        }
        j->line_len -= (size_t) (start - j->line);
        memmove(j->line, start, j->line_len + 1);
        if (j->line_dropped)
                j->line_len = 0;
        return 0;
}

/* What the worker wrote before it exited may still be in the pipe: read
 * it to its end (or to what a reaper the worker left holds open). */
static void job_drain(Job *j) {
        (void) fcntl(j->pipe_fd, F_SETFL, O_NONBLOCK);
        while (j->pipe_source)
                (void) on_pipe(j->pipe_source, j->pipe_fd, 0, j);
}

static int on_child(sd_event_source *s, const siginfo_t *si, void *userdata) {
        Job *j = userdata;
        Manager *m = j->manager;

        job_drain(j);

        if (j->state == JOB_CANCELLED)
                ;
        else if (si->si_code == CLD_EXITED && si->si_status == 0 && j->result)
                j->state = JOB_DONE;
        else {
                j->state = JOB_FAILED;
                if (j->error == 0) {
                        j->error = -EIO;
                        free(j->error_text);
                        j->error_text = strdup(si->si_code == CLD_EXITED ? "the worker failed"
                                                                          : "the worker was killed");
                }
        }
        j->worker = 0;
        j->child_source = sd_event_source_disable_unref(j->child_source);
        manager_job_finished(m, j);
        (void) job_send_removed(j);
        job_unlink(m, j);
        job_free(j);
        return 0;
}

int job_start(Manager *m, JobType type, const char *target, job_work_t work, void *userdata,
              void (*userdata_free)(void *), Job **ret) {
        Job *j;
        int fds[2], bus_fd, r;
        pid_t pid;

        /* One reap job is never kept out by callers' jobs: deletes and a
         * disk running full need it. */
        if (m->n_jobs >= JOBS_MAX && (type != JOB_REAP || job_type_running(m, JOB_REAP))) {
                if (userdata_free)
                        userdata_free(userdata);
                return -EAGAIN;
        }
        j = calloc(1, sizeof *j);
        if (!j) {
                if (userdata_free)
                        userdata_free(userdata);
                return -ENOMEM;
        }
        j->manager = m;
        j->type = type;
        j->pipe_fd = -EBADF;
        j->target = strdup(target ? target : "");
        if (!j->target || pipe2(fds, O_CLOEXEC) < 0) {
                r = -errno ?: -ENOMEM;
                goto fail;
        }

        /* Asked before the fork: sd-bus refuses a forked child's calls. */
        bus_fd = sd_bus_get_fd(m->bus);
        pid = fork();
        if (pid < 0) {
                r = -errno;
                close(fds[0]);
                close(fds[1]);
                goto fail;
        }
        if (pid == 0) {
                store_close_inherited(); /* the worker opens its own */
                /* The worker must not keep the daemon's bus connection: a
                 * daemon killed while its workers run would keep its name. */
                if (bus_fd >= 0)
                        (void) close(bus_fd);
                close(fds[0]);
                worker_fd = fds[1];
                (void) prctl(PR_SET_PDEATHSIG, SIGTERM);
                (void) signal(SIGTERM, SIG_DFL);
                (void) signal(SIGINT, SIG_DFL);
                /* A stream's reader that goes away is an error to report
                 * (EPIPE), not a reason to die without a word. */
                (void) signal(SIGPIPE, SIG_IGN);
                {
                        sigset_t all;

                        sigemptyset(&all);
                        (void) sigprocmask(SIG_SETMASK, &all, NULL);
                }
                worker_main(m, work, userdata);
        }
        if (userdata_free)
                userdata_free(userdata);
        userdata = NULL;
        close(fds[1]);
        j->pipe_fd = fds[0];
        j->worker = pid;

        r = sd_event_add_io(m->event, &j->pipe_source, j->pipe_fd, EPOLLIN, on_pipe, j);
        if (r >= 0)
                r = sd_event_add_child(m->event, &j->child_source, pid, WEXITED, on_child, j);
        if (r < 0) {
                (void) kill(pid, SIGKILL);
                (void) waitpid(pid, NULL, 0);
                goto fail;
        }
        /* The pipe is read before the exit is handled. */
        (void) sd_event_source_set_priority(j->child_source, SD_EVENT_PRIORITY_NORMAL + 10);

        j->id = ++m->next_job_id;
        j->next = m->jobs;
        m->jobs = j;
        m->n_jobs++;
        /* Every job, also those the daemon starts itself (reaps), is
         * announced as it starts. */
        (void) job_send_new(j);
        *ret = j;
        return 0;

fail:
        if (userdata && userdata_free)
                userdata_free(userdata);
        job_free(j);
        return r;
}

static int on_kill_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Job *j = userdata;

        if (j->worker > 0)
                (void) kill(j->worker, SIGKILL);
        return 0;
}

static int on_owner_gone(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        const char *name, *old_owner, *new_owner;
        Job *j = userdata;

        if (sd_bus_message_read(message, "sss", &name, &old_owner, &new_owner) >= 0 && !*new_owner)
                (void) job_cancel(j);
        return 0;
}

int job_watch_owner(Job *j, const char *sender) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_free_ char *rule = NULL;
        int r, has_owner;

        if (!sender || sender[0] != ':')
                return 0;
        if (asprintf(&rule, "type='signal',sender='org.freedesktop.DBus',path='/org/freedesktop/DBus',"
                     "interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='%s'", sender) < 0)
                return -ENOMEM;
        r = sd_bus_add_match(j->manager->bus, &j->owner_watch, rule, on_owner_gone, j);
        if (r < 0)
                return r;
        /* A caller that left before the match was in place (one that sent
         * its call and exited) was announced to no one: ask after it once
         * the match is in place, or its task would run on without it. */
        r = sd_bus_call_method(j->manager->bus, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                               "org.freedesktop.DBus", "NameHasOwner", &error, &reply, "s", sender);
        if (r >= 0)
                r = sd_bus_message_read(reply, "b", &has_owner);
        if (r < 0)
                return r;
        if (!has_owner)
                (void) job_cancel(j);
        return 0;
}

int job_cancel(Job *j) {
        siginfo_t si = {};

        if (j->state != JOB_RUNNING || j->worker <= 0)
                return -ESRCH;
        /* A worker that exited has done its work (or failed it): its end,
         * on its way to on_child(), is what the job did, not a cancel. */
        if (waitid(P_PID, j->worker, &si, WEXITED | WNOHANG | WNOWAIT) >= 0 && si.si_pid == j->worker)
                return -ESRCH;
        j->state = JOB_CANCELLED;
        free(j->error_text);
        j->error_text = strdup("cancelled");
        j->error = -ECANCELED;
        if (kill(j->worker, SIGTERM) < 0)
                return -errno;
        /* A worker that does not end on SIGTERM gets SIGKILL. */
        return sd_event_add_time_relative(j->manager->event, &j->kill_timer, CLOCK_MONOTONIC, CANCEL_KILL_USEC,
                                          0, on_kill_timer, j);
}
