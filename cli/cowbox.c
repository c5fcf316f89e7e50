/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * cowbox: the client of cowboxd. Every command is one or a few calls on the
 * bus (org.cowbox1); long work is a job that the command follows to its
 * end, with a progress line on a terminal.
 */

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "cleanup.h"
#include "output-file.h"
#include "string-util.h"

#define PROGRAM "cowbox"
#define EXIT_USAGE 2
/* The daemon is not there, or the bus is not. */
#define EXIT_UNAVAILABLE 69

#define _cleanup_bus_ _cleanup_(sd_bus_flush_close_unrefp)
#define _cleanup_message_ _cleanup_(sd_bus_message_unrefp)
#define _cleanup_bus_error_ _cleanup_(sd_bus_error_free)

static bool arg_json;

/* "cowbox COMMAND --help": prints the help of noun's commands and returns
 * HELP_SHOWN, which main() turns into exit status 0. */
#define HELP_SHOWN (-1)
static int command_help(const char *noun);

/* A task's output is its bytes, NULs too (\u0000 in the daemon's JSON). */
static json_t *parse_json(const char *text) {
        return json_loads(text, JSON_ALLOW_NUL, NULL);
}

_printf_(1, 2)
static int fail(const char *format, ...) {
        va_list ap;

        fputs(PROGRAM ": ", stderr);
        va_start(ap, format);
        vfprintf(stderr, format, ap);
        va_end(ap);
        fputc('\n', stderr);
        return EXIT_FAILURE;
}

_printf_(1, 2)
static int usage_error(const char *format, ...) {
        va_list ap;

        fputs(PROGRAM ": ", stderr);
        va_start(ap, format);
        vfprintf(stderr, format, ap);
        va_end(ap);
        fputs("; see '" PROGRAM " --help'\n", stderr);
        return EXIT_USAGE;
}

static int bus_failure(const char *what, int r, const sd_bus_error *error) {
        if (sd_bus_error_is_set(error)) {
                if (sd_bus_error_has_names(error, SD_BUS_ERROR_SERVICE_UNKNOWN, SD_BUS_ERROR_NAME_HAS_NO_OWNER)) {
                        fprintf(stderr, PROGRAM ": cowboxd is not running (start it: cowboxd --store DIR)\n");
                        return EXIT_UNAVAILABLE;
                }
                /* The bus policy refused the call before cowboxd saw it. */
                if (sd_bus_error_has_name(error, SD_BUS_ERROR_ACCESS_DENIED))
                        return fail("%s: access denied: only root and members of the group '" API_GROUP "' may "
                                    "change the store", what);
                return fail("%s: %s", what, error->message ? error->message : error->name);
        }
        return fail("%s: %s", what, strerror(-r));
}

static int connect_bus(sd_bus **ret) {
        int r = sd_bus_open_system(ret);

        if (r < 0) {
                fprintf(stderr, PROGRAM ": cannot reach the system bus (%s); set DBUS_SYSTEM_BUS_ADDRESS to "
                        "the bus cowboxd serves on\n", strerror(-r));
                return EXIT_UNAVAILABLE;
        }
        return 0;
}

/* cowboxd answers these once a workspace's FUSE server has let go of it
 * (up to 15 s) and a new one serves it (up to 90 s), after the start of a
 * server already under way, if any (up to 90 s): more than sd-bus's
 * default 25 s. Others answer at once, or start a job. */
static uint64_t call_timeout_usec(const char *method) {
        static const char *const waiting[] = { "CreateWorkspace", "RemoveWorkspace", "RestoreWorkspace" };

        for (size_t i = 0; i < ELEMENTSOF(waiting); i++)
                if (streq(method, waiting[i]))
                        return 240 * 1000000ULL;
        return 0;
}

/* Calls a Manager method with the arguments in ap; ret receives the reply. */
static int call_va(sd_bus *bus, const char *method, sd_bus_message **ret, sd_bus_error *error,
                   const char *types, va_list ap) {
        _cleanup_message_ sd_bus_message *m = NULL;
        int r;

        r = sd_bus_message_new_method_call(bus, &m, API_SERVICE, API_MANAGER_PATH, API_MANAGER_INTERFACE, method);
        if (r >= 0 && types)
                r = sd_bus_message_appendv(m, types, ap);
        if (r < 0)
                return r;
        return sd_bus_call(bus, m, call_timeout_usec(method), error, ret);
}

/* Prints a document from the daemon: as it is with --json, else through a
 * printer of the command's own. */
static void print_json(json_t *doc, void (*printer)(json_t *doc)) {
        if (arg_json || !printer) {
                json_dumpf(doc, stdout, JSON_INDENT(2));
                putchar('\n');
        } else
                printer(doc);
}

static int print_json_text(const char *text, void (*printer)(json_t *doc)) {
        json_t *doc = parse_json(text);

        if (!doc)
                return fail("the daemon sent malformed JSON");
        print_json(doc, printer);
        json_decref(doc);
        return EXIT_SUCCESS;
}

/* Calls a Manager method that answers with a JSON document and parses it
 * into *ret; an exit status, with the failure said, if that fails. */
static int call_for_json_va(json_t **ret, const char *method, const char *types, va_list ap) {
        _cleanup_bus_error_ sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_message_ sd_bus_message *reply = NULL;
        _cleanup_bus_ sd_bus *bus = NULL;
        const char *text;
        int r;

        r = connect_bus(&bus);
        if (r != 0)
                return r;
        r = call_va(bus, method, &reply, &error, types, ap);
        if (r >= 0)
                r = sd_bus_message_read(reply, "s", &text);
        if (r < 0)
                return bus_failure(method, r, &error);
        *ret = parse_json(text);
        if (!*ret)
                return fail("the daemon sent malformed JSON");
        return EXIT_SUCCESS;
}

static int call_for_json(json_t **ret, const char *method, const char *types, ...) {
        va_list ap;
        int r;

        va_start(ap, types);
        r = call_for_json_va(ret, method, types, ap);
        va_end(ap);
        return r;
}

static int call_json(const char *method, void (*printer)(json_t *doc), const char *types, ...) {
        json_t *doc = NULL;
        va_list ap;
        int r;

        va_start(ap, types);
        r = call_for_json_va(&doc, method, types, ap);
        va_end(ap);
        if (r != EXIT_SUCCESS)
                return r;
        print_json(doc, printer);
        json_decref(doc);
        return EXIT_SUCCESS;
}

/* ---- following a job ---- */

typedef struct JobWait {
        uint32_t id;
        bool done;
        bool daemon_gone;
        char *result;
        char *json;
} JobWait;

static int on_job_removed(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        JobWait *w = userdata;
        const char *path, *result, *json;
        uint32_t id;

        if (sd_bus_message_read(m, "uoss", &id, &path, &result, &json) < 0 || id != w->id)
                return 0;
        w->done = true;
        w->result = strdup(result);
        w->json = strdup(json);
        return 0;
}

static int on_owner_changed(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        JobWait *w = userdata;
        const char *name, *old_owner, *new_owner;

        if (sd_bus_message_read(m, "sss", &name, &old_owner, &new_owner) >= 0 && streq(name, API_SERVICE) &&
            !*new_owner)
                w->daemon_gone = true;
        return 0;
}

static void show_progress(sd_bus *bus, const char *path, const char *what) {
        uint64_t done = 0, total = 0;
        char line[128];

        if (sd_bus_get_property_trivial(bus, API_SERVICE, path, API_JOB_INTERFACE, "BytesDone", NULL, 't',
                                        &done) < 0)
                return;
        (void) sd_bus_get_property_trivial(bus, API_SERVICE, path, API_JOB_INTERFACE, "BytesTotal", NULL, 't',
                                           &total);
        if (total > 0) {
                unsigned pct = (unsigned) MIN(done * 100 / total, (uint64_t) 100);
                char bar[31];

                memset(bar, '#', pct * 30 / 100);
                memset(bar + pct * 30 / 100, '.', 30 - pct * 30 / 100);
                bar[30] = 0;
                snprintf(line, sizeof line, "%s [%s] %3u%% %.1f MiB", what, bar, pct, (double) done / (1 << 20));
        } else
                snprintf(line, sizeof line, "%s %.1f MiB", what, (double) done / (1 << 20));
        fprintf(stderr, "\r%s\033[K", line);
}

/* Subscribes to the end of jobs and to the daemon going away: before the
 * call that starts a job, so that the end of a short one is not missed. */
static int job_subscribe(sd_bus *bus, JobWait *w) {
        int r;

        r = sd_bus_match_signal(bus, NULL, API_SERVICE, API_MANAGER_PATH, API_MANAGER_INTERFACE, "JobRemoved",
                                on_job_removed, w);
        if (r >= 0)
                r = sd_bus_add_match(bus, NULL, "type='signal',sender='org.freedesktop.DBus',"
                                     "member='NameOwnerChanged',arg0='" API_SERVICE "'", on_owner_changed, w);
        return r;
}

/* Follows the job a reply names to its end; prints its result. With
 * ret_json, the result document is returned instead of printed. */
static int job_follow(sd_bus *bus, sd_bus_message *reply, JobWait *w, const char *what,
                      void (*printer)(json_t *doc), json_t **ret_json) {
        bool tty = isatty(STDERR_FILENO);
        const char *path;
        int r;

        r = sd_bus_message_read(reply, "uo", &w->id, &path);
        if (r < 0)
                return fail("%s: %s", what, strerror(-r));
        while (!w->done) {
                if (w->daemon_gone) {
                        if (tty)
                                fputs("\r\033[K", stderr);
                        fail("%s: cowboxd exited before the job ended; see 'cowbox status' once it is back",
                             what);
                        return EXIT_UNAVAILABLE;
                }
                r = sd_bus_process(bus, NULL);
                if (r < 0)
                        return fail("%s: lost the bus: %s", what, strerror(-r));
                if (r > 0)
                        continue;
                if (tty)
                        show_progress(bus, path, what);
                r = sd_bus_wait(bus, 200 * 1000);
                if (r < 0)
                        return fail("%s: lost the bus: %s", what, strerror(-r));
        }
        if (tty)
                fputs("\r\033[K", stderr);

        if (!streq(w->result, "done")) {
                json_t *doc = parse_json(w->json);
                const char *text = json_string_value(json_object_get(doc, "error"));

                r = fail("%s %s: %s", what, w->result, text ? text : "no reason given");
                json_decref(doc);
        } else if (ret_json) {
                *ret_json = parse_json(w->json);
                r = *ret_json ? EXIT_SUCCESS : fail("the daemon sent malformed JSON");
        } else
                r = print_json_text(w->json, printer);
        free(w->result);
        free(w->json);
        return r;
}

/* Starts a job with a Manager method and follows it to its end; its result
 * is printed, or returned in ret_json if that is given. */
static int run_job(const char *what, void (*printer)(json_t *doc), json_t **ret_json, const char *method,
                   const char *types, ...) {
        _cleanup_bus_error_ sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_message_ sd_bus_message *reply = NULL;
        _cleanup_bus_ sd_bus *bus = NULL;
        JobWait w = {};
        va_list ap;
        int r;

        r = connect_bus(&bus);
        if (r != 0)
                return r;
        r = job_subscribe(bus, &w);
        if (r < 0)
                return bus_failure(what, r, &error);
        va_start(ap, types);
        r = call_va(bus, method, &reply, &error, types, ap);
        va_end(ap);
        if (r < 0)
                return bus_failure(what, r, &error);
        return job_follow(bus, reply, &w, what, printer, ret_json);
}

/* ---- output ---- */

static const char *human_bytes(uint64_t v, char buf[static 32]) {
        static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
        double d = (double) v;
        unsigned u = 0;

        while (d >= 1024 && u < 4) {
                d /= 1024;
                u++;
        }
        snprintf(buf, 32, u == 0 ? "%.0f %s" : "%.1f %s", d, units[u]);
        return buf;
}

static uint64_t num(json_t *o, const char *key) {
        json_t *v = json_object_get(o, key);

        return json_is_integer(v) ? (uint64_t) json_integer_value(v) : 0;
}

static const char *str(json_t *o, const char *key) {
        const char *s = json_string_value(json_object_get(o, key));

        return s && *s ? s : "-";
}

/* A damaged record's name may be anything: one that is no longer a valid
 * name is neither printed nor usable, and its ID deletes it. */
static void print_damaged_subvolume(json_t *v) {
        const char *name = json_string_value(json_object_get(v, "name"));

        if (name && store_name_is_valid(name))
                printf("%-24s %-9s damaged record: 'cowbox rm %s' mends the store\n", name, "-", name);
        else
                printf("%-24s %-9s damaged record of ID %" PRIu64 ": 'cowbox-store subvolume delete --id %" PRIu64
                       "' mends the store\n", "?", "-", num(v, "id"), num(v, "id"));
}

static void print_subvolume_table(json_t *list) {
        char a[32], b[32], c[32];
        size_t i;
        json_t *v;

        printf("%-24s %-9s %10s %10s %10s\n", "NAME", "READ-ONLY", "LOGICAL", "STORED", "EXCLUSIVE");
        json_array_foreach(list, i, v) {
                if (json_is_true(json_object_get(v, "damaged"))) {
                        print_damaged_subvolume(v);
                        continue;
                }
                printf("%-24s %-9s %10s %10s %10s\n", str(v, "name"),
                       json_is_true(json_object_get(v, "readonly")) ? "yes" : "no",
                       human_bytes(num(v, "logical_bytes"), a), human_bytes(num(v, "referenced_bytes"), b),
                       human_bytes(num(v, "exclusive_bytes"), c));
        }
}

static void print_subvolume(json_t *v) {
        char a[32];

        printf("Name:           %s\n", str(v, "name"));
        printf("UUID:           %s\n", str(v, "uuid"));
        printf("Parent UUID:    %s\n", str(v, "parent_uuid"));
        printf("Received UUID:  %s\n", str(v, "received_uuid"));
        printf("Read-only:      %s\n", json_is_true(json_object_get(v, "readonly")) ? "yes" : "no");
        printf("Logical:        %s\n", human_bytes(num(v, "logical_bytes"), a));
        printf("Stored:         %s\n", human_bytes(num(v, "referenced_bytes"), a));
        printf("Exclusive:      %s\n", human_bytes(num(v, "exclusive_bytes"), a));
        printf("Inodes:         %" PRIu64 "\n", num(v, "inodes"));
        printf("Quota:          %s\n", num(v, "quota_bytes") ? human_bytes(num(v, "quota_bytes"), a) : "none");
}

static void print_status(json_t *v) {
        json_t *u = json_object_get(v, "usage"), *reaper = json_object_get(v, "reaper");
        char a[32], b[32];

        printf("Store:              %s\n", str(v, "store"));
        printf("Subvolumes:         %" PRIu64 "\n", num(u, "subvolumes"));
        if (num(u, "damaged_subvolumes") > 0)
                printf("  Damaged:          %" PRIu64 " ('cowbox-store scrub' names them)\n",
                       num(u, "damaged_subvolumes"));
        printf("Logical:            %s\n", human_bytes(num(u, "logical_bytes"), a));
        printf("Stored:             %s\n", human_bytes(num(u, "stored_bytes"), a));
        printf("Free on disk:       %s of %s\n", human_bytes(num(u, "fs_free_bytes"), a),
               human_bytes(num(u, "fs_total_bytes"), b));
        printf("Reaper backlog:     %s%s%s\n", human_bytes(num(reaper, "backlog_bytes"), a),
               json_is_true(json_object_get(reaper, "paused")) ? " (paused)" : "",
               json_is_true(json_object_get(reaper, "urgent")) ? " (in a hurry: free space is below the low mark)" : "");
        printf("Corruption events:  %" PRIu64 "\n", num(u, "corruption_events"));
        printf("Jobs:               %zu\n", json_array_size(json_object_get(v, "jobs")));
}

static void print_received(json_t *v) {
        size_t i;
        json_t *name;

        json_array_foreach(json_object_get(v, "images"), i, name)
                printf("Received image '%s'.\n", json_string_value(name));
}

static void print_scrub(json_t *v) {
        char a[32];
        size_t i;
        json_t *d;

        printf("Checked %" PRIu64 " blocks (%s): %" PRIu64 " damaged; %" PRIu64 " metadata records: %" PRIu64
               " damaged; %" PRIu64 " files affected.\n",
               num(v, "blocks_checked"), human_bytes(num(v, "bytes_checked"), a), num(v, "blocks_damaged"),
               num(v, "rows_checked"), num(v, "rows_damaged"), num(v, "files_damaged"));
        json_array_foreach(json_object_get(v, "damage"), i, d)
                printf("  %s: %s/%s (%s)\n", str(d, "digest"), str(d, "subvolume"), str(d, "path"), str(d, "reason"));
}

static void print_reap(json_t *v) {
        char a[32];

        printf("Freed %s (%" PRIu64 " blocks, %" PRIu64 " layers dropped, %" PRIu64 " folded).\n",
               human_bytes(num(v, "bytes_freed"), a), num(v, "blocks_freed"), num(v, "layers_dropped"),
               num(v, "layers_folded"));
}

static void print_job_table(json_t *list) {
        size_t i;
        json_t *v;

        printf("%-6s %-10s %-10s %-32s %s\n", "ID", "TYPE", "STATE", "PROGRESS", "TARGET");
        json_array_foreach(list, i, v) {
                uint64_t done = num(v, "bytes_done"), total = num(v, "bytes_total");
                char progress[96] = "-", a[32], b[32];

                if (total > 0)
                        snprintf(progress, sizeof progress, "%s of %s (%u%%)", human_bytes(done, a),
                                 human_bytes(total, b), (unsigned) (MIN(done, total) * 100 / total));
                printf("%-6" PRIu64 " %-10s %-10s %-32s %s\n", num(v, "id"), str(v, "type"), str(v, "state"),
                       progress, str(v, "target"));
        }
}

static void print_nothing(json_t *v) {
}

static void print_workspace(json_t *v) {
        char a[32];

        printf("Name:        %s\n", str(v, "name"));
        printf("State:       %s%s%s%s\n", str(v, "state"), json_is_true(json_object_get(v, "full")) ? ", full" : "",
               json_is_true(json_object_get(v, "warning")) && !json_is_true(json_object_get(v, "full"))
                       ? ", near its limit" : "",
               json_is_true(json_object_get(v, "unsafe_mount_point"))
                       ? " (its mount point is not a plain directory of root or its owner)" : "");
        printf("Path:        %s\n", str(v, "path"));
        printf("Owner:       %s (%" PRIu64 ")\n", str(v, "owner_name"), num(v, "owner"));
        printf("Image:       %s\n", str(v, "image"));
        printf("Logical:     %s\n", human_bytes(num(v, "logical_bytes"), a));
        printf("Stored:      %s\n", human_bytes(num(v, "stored_bytes"), a));
        printf("Exclusive:   %s\n", human_bytes(num(v, "exclusive_bytes"), a));
        printf("Limit:       %s\n", num(v, "limit_bytes") ? human_bytes(num(v, "limit_bytes"), a) : "none");
}

static void print_workspace_table(json_t *list) {
        char a[32], b[32];
        size_t i;
        json_t *v;

        printf("%-20s %-10s %-12s %10s %10s  %s\n", "NAME", "STATE", "OWNER", "LOGICAL", "LIMIT", "PATH");
        json_array_foreach(list, i, v)
                printf("%-20s %-10s %-12s %10s %10s  %s\n", str(v, "name"), str(v, "state"), str(v, "owner_name"),
                       human_bytes(num(v, "logical_bytes"), a),
                       num(v, "limit_bytes") ? human_bytes(num(v, "limit_bytes"), b) : "none", str(v, "path"));
}

static void print_checkpoints(json_t *list) {
        char a[32];
        size_t i;
        json_t *v;

        printf("%-24s %-20s %10s\n", "LABEL", "CREATED", "EXCLUSIVE");
        json_array_foreach(list, i, v) {
                time_t t = (time_t) (num(v, "created_usec") / 1000000);
                char when[32];

                strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
                printf("%-24s %-20s %10s\n", str(v, "label"), when, human_bytes(num(v, "exclusive_bytes"), a));
        }
}

/* ---- commands ---- */

static int call_void(const char *method, const char *done, const char *types, ...) {
        _cleanup_bus_error_ sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_message_ sd_bus_message *reply = NULL;
        _cleanup_bus_ sd_bus *bus = NULL;
        va_list ap;
        int r;

        r = connect_bus(&bus);
        if (r != 0)
                return r;
        va_start(ap, types);
        r = call_va(bus, method, &reply, &error, types, ap);
        va_end(ap);
        if (r < 0)
                return bus_failure(method, r, &error);
        if (!arg_json && done)
                puts(done);
        return EXIT_SUCCESS;
}

static int need_args(int argc, char *argv[], int min, int max, const char *synopsis) {
        if (argc - optind < min)
                return usage_error("missing arguments (usage: " PROGRAM " %s)", synopsis);
        if (argc - optind > max)
                return usage_error("unexpected argument '%s' (usage: " PROGRAM " %s)", argv[optind + max],
                                   synopsis);
        return 0;
}

/* Options of a command: getopt on what follows the command's words.
 * getopt's own messages would name that word as the program ("run:
 * unrecognized option"): option_error() says what is wrong instead. */
static void reset_getopt(void) {
        optind = 1;
        opterr = 0;
}

/* The usage error of a bad option of command: c is what getopt returned,
 * '?' for an option the command does not have, ':' for one without its
 * value (the option string starts with ':'). */
static int option_error(const char *command, int c, int argc, char *argv[]) {
        const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "";
        char letter[3];

        /* A short option among others ("-rx") is known only by its letter. */
        if (optopt > 0 && optopt < 0x80 && !startswith(arg, "--")) {
                snprintf(letter, sizeof letter, "-%c", optopt);
                arg = letter;
        }
        if (c == ':')
                return usage_error("option '%s' of '%s' needs a value", arg, command);
        /* A flag given a value ("--keep=yes"): getopt names the flag. */
        if (optopt > 0 && startswith(arg, "--") && strchr(arg, '='))
                return usage_error("option '%.*s' of '%s' takes no value", (int) strcspn(arg, "="), arg, command);
        if (streq(arg, "--json"))
                return usage_error("--json goes before the command: " PROGRAM " --json %s", command);
        return usage_error("'%s' has no option '%.*s'", command, (int) strcspn(arg, "="), arg);
}

static int json_options(json_t *doc, char **ret) {
        *ret = api_json_text(doc);
        json_decref(doc);
        return *ret ? 0 : -ENOMEM;
}

static int verb_image_receive(int argc, char *argv[]) {
        static const struct option options[] = {
                { "file", required_argument, NULL, 'f' },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        _cleanup_free_ char *opts = NULL;
        _cleanup_close_ int fd = -EBADF;
        const char *file = NULL;
        int c, r;

        reset_getopt();
        while ((c = getopt_long(argc, argv, ":hf:", options, NULL)) >= 0)
                if (c == 'f')
                        file = optarg;
                else if (c == 'h')
                        return command_help("image");
                else
                        return option_error("image receive", c, argc, argv);
        r = need_args(argc, argv, 0, 1, "image receive [-f FILE] [NAME]");
        if (r)
                return r;
        if (file && !streq(file, "-")) {
                fd = open(file, O_RDONLY | O_CLOEXEC);
                if (fd < 0)
                        return fail("cannot open %s: %m", file);
        } else if (isatty(STDIN_FILENO))
                return usage_error("standard input is a terminal; give the stream with -f FILE or a pipe");
        if (json_options(optind < argc ? json_pack("{s:s}", "name", argv[optind]) : json_object(), &opts) < 0)
                return fail("out of memory");
        return run_job("receiving", print_received, NULL, "ReceiveImage", "hs", fd >= 0 ? fd : STDIN_FILENO, opts);
}

static int verb_image_send(int argc, char *argv[]) {
        static const struct option options[] = {
                { "parent", required_argument, NULL, 'p' },
                { "file", required_argument, NULL, 'f' },
                { "proto", required_argument, NULL, 'P' },
                { "compressed-data", no_argument, NULL, 'c' },
                { "zstd", no_argument, NULL, 'z' },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        _cleanup_free_ char *opts = NULL;
        _cleanup_(output_file_abort) OutputFile out = { .fd = -EBADF };
        const char *file = NULL, *parent = NULL;
        bool compressed = false, zstd = false;
        int version = 0, c, r;
        json_t *doc;

        reset_getopt();
        while ((c = getopt_long(argc, argv, ":hp:f:", options, NULL)) >= 0)
                switch (c) {
                case 'p': parent = optarg; break;
                case 'f': file = optarg; break;
                case 'P':
                        if (!streq(optarg, "1") && !streq(optarg, "2"))
                                return usage_error("--proto takes 1 or 2");
                        version = optarg[0] - '0';
                        break;
                case 'c': compressed = true; break;
                case 'z': zstd = true; break;
                case 'h': return command_help("image");
                default: return option_error("image send", c, argc, argv);
                }
        if (compressed && version == 1)
                return usage_error("--compressed-data needs --proto 2 (version 1 streams carry no compressed data)");
        if (version == 0)
                version = compressed ? 2 : 1;
        r = need_args(argc, argv, 1, 1, "image send [-p PARENT] [-f FILE] [--proto 1|2] [--compressed-data] [--zstd] IMAGE");
        if (r)
                return r;
        if (file && !streq(file, "-")) {
                r = output_file_open(file, &out);
                if (r < 0)
                        return fail("cannot create %s: %s", file, strerror(-r));
        } else if (isatty(STDOUT_FILENO))
                return usage_error("standard output is a terminal; write the stream with -f FILE or into a pipe");
        doc = json_pack("{s:i, s:b, s:b}", "version", version, "compressed_data", compressed, "zstd", zstd);
        if (parent)
                json_object_set_new(doc, "parent", json_string(parent));
        if (json_options(doc, &opts) < 0)
                return fail("out of memory");
        /* The stream may be on standard output: say nothing there. */
        arg_json = false;
        r = run_job("sending", print_nothing, NULL, "SendImage", "shs", argv[optind],
                    out.fd >= 0 ? out.fd : STDOUT_FILENO, opts);
        if (r == EXIT_SUCCESS) {
                r = output_file_commit(&out);
                if (r < 0)
                        return fail("cannot write %s: %s", file, strerror(-r));
        }
        return r;
}

static int verb_snapshot(int argc, char *argv[]) {
        static const struct option options[] = {
                { "read-only", no_argument, NULL, 'r' },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        bool readonly = false;
        int c, r;

        reset_getopt();
        while ((c = getopt_long(argc, argv, ":hr", options, NULL)) >= 0)
                if (c == 'r')
                        readonly = true;
                else if (c == 'h')
                        return command_help("snapshot");
                else
                        return option_error("snapshot", c, argc, argv);
        r = need_args(argc, argv, 2, 2, "snapshot [-r] SOURCE NAME");
        if (r)
                return r;
        return call_void("Snapshot", "Snapshot taken.", "sss", argv[optind], argv[optind + 1],
                         readonly ? "{\"readonly\": true}" : "{}");
}

/* The words of a synopsis that name its command: "workspace show" of
 * "workspace show NAME". */
static const char *synopsis_command(const char *synopsis, char *buf, size_t size) {
        size_t n = 0;

        while (synopsis[n] && !(n > 0 && synopsis[n - 1] == ' ' && (isupper((unsigned char) synopsis[n]) ||
                                                                   synopsis[n] == '[')))
                n++;
        while (n > 0 && synopsis[n - 1] == ' ')
                n--;
        snprintf(buf, size, "%.*s", (int) n, synopsis);
        return buf;
}

/* A command without options: checks that, and its number of arguments. */
static int verb_options_none(int argc, char *argv[], const char *synopsis) {
        static const struct option help[] = { { "help", no_argument, NULL, 'h' }, {} };
        char command[64];
        int c;

        reset_getopt();
        c = getopt_long(argc, argv, ":h", help, NULL);
        if (c == 'h') {
                snprintf(command, sizeof command, "%.*s", (int) strcspn(synopsis, " "), synopsis);
                return command_help(command);
        }
        if (c >= 0)
                return option_error(synopsis_command(synopsis, command, sizeof command), c, argc, argv);
        return 0;
}

static int verb_simple(int argc, char *argv[], int nargs, const char *synopsis) {
        return verb_options_none(argc, argv, synopsis) ?: need_args(argc, argv, nargs, nargs, synopsis);
}

/* SIZE: bytes with an optional K, M, G or T (binary), or "none". */
static int parse_size(const char *text, uint64_t *ret) {
        char *end = NULL;
        unsigned long long v;
        unsigned shift = 0;

        if (streq(text, "none")) {
                *ret = 0;
                return 0;
        }
        /* strtoull would take "-1" as 2^64 - 1. */
        if (!isdigit((unsigned char) text[0]))
                return -EINVAL;
        errno = 0;
        v = strtoull(text, &end, 10);
        if (errno || end == text)
                return -EINVAL;
        switch (*end) {
        case 'K': case 'k': shift = 10; end++; break;
        case 'M': case 'm': shift = 20; end++; break;
        case 'G': case 'g': shift = 30; end++; break;
        case 'T': case 't': shift = 40; end++; break;
        }
        if (*end == 'i' && end[1] == 'B')
                end += 2;
        if (*end || v > (UINT64_C(1) << 62) >> shift)
                return -EINVAL;
        *ret = (uint64_t) v << shift;
        return 0;
}

static int verb_workspace_create(int argc, char *argv[]) {
        static const struct option options[] = {
                { "image", required_argument, NULL, 'i' },
                { "owner", required_argument, NULL, 'o' },
                { "limit", required_argument, NULL, 'l' },
                { "path", required_argument, NULL, 'p' },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        _cleanup_free_ char *opts = NULL;
        json_t *doc = json_object();
        uint64_t limit;
        int c, r;

        reset_getopt();
        while ((c = getopt_long(argc, argv, ":h", options, NULL)) >= 0)
                switch (c) {
                case 'h':
                        json_decref(doc);
                        return command_help("workspace");
                case 'i': json_object_set_new(doc, "image", json_string(optarg)); break;
                case 'o': json_object_set_new(doc, "owner", json_string(optarg)); break;
                case 'p': json_object_set_new(doc, "path", json_string(optarg)); break;
                case 'l':
                        if (parse_size(optarg, &limit) < 0) {
                                json_decref(doc);
                                return usage_error("'%s' is not a size (e.g. 20G)", optarg);
                        }
                        json_object_set_new(doc, "limit", json_integer((json_int_t) limit));
                        break;
                default:
                        json_decref(doc);
                        return option_error("workspace create", c, argc, argv);
                }
        r = need_args(argc, argv, 1, 1, "workspace create NAME --image IMAGE [--owner USER] [--limit SIZE] [--path PATH]");
        if (r == 0 && !json_object_get(doc, "image"))
                r = usage_error("name the image with --image IMAGE");
        if (r) {
                json_decref(doc);
                return r;
        }
        if (json_options(doc, &opts) < 0)
                return fail("out of memory");
        return call_json("CreateWorkspace", print_workspace, "ss", argv[optind], opts);
}

static int verb_workspace(int argc, char *argv[]) {
        const char *verb = argc > 1 ? argv[1] : "";
        uint64_t limit;

        if (argc < 2)
                return usage_error("no workspace command given; give one of create, list, show, checkpoint, "
                                   "checkpoints, restore, set-limit, rm");
        argc--, argv++;
        if (streq(verb, "--help") || streq(verb, "-h"))
                return command_help("workspace");
        if (streq(verb, "create"))
                return verb_workspace_create(argc, argv);
        if (streq(verb, "list"))
                return verb_simple(argc, argv, 0, "workspace list") ?:
                       call_json("ListWorkspaces", print_workspace_table, NULL);
        if (streq(verb, "show"))
                return verb_simple(argc, argv, 1, "workspace show NAME") ?:
                       call_json("GetWorkspace", print_workspace, "s", argv[optind]);
        if (streq(verb, "rm"))
                return verb_simple(argc, argv, 1, "workspace rm NAME") ?:
                       call_void("RemoveWorkspace", "Workspace removed.", "s", argv[optind]);
        if (streq(verb, "checkpoints"))
                return verb_simple(argc, argv, 1, "workspace checkpoints NAME") ?:
                       call_json("ListCheckpoints", print_checkpoints, "s", argv[optind]);
        if (streq(verb, "restore"))
                return verb_simple(argc, argv, 2, "workspace restore NAME LABEL") ?:
                       call_void("RestoreWorkspace", "Workspace restored.", "ss", argv[optind], argv[optind + 1]);
        if (streq(verb, "set-limit")) {
                int r = verb_simple(argc, argv, 2, "workspace set-limit NAME SIZE");
                if (r != 0)
                        return r;
                if (parse_size(argv[optind + 1], &limit) < 0)
                        return usage_error("'%s' is not a size (e.g. 20G, or none)", argv[optind + 1]);
                return call_void("SetWorkspaceLimit", "Limit set.", "st", argv[optind], limit);
        }
        if (streq(verb, "checkpoint")) {
                char stamp[32];
                const char *label = stamp;

                int r = verb_options_none(argc, argv, "workspace checkpoint NAME [LABEL]") ?:
                        need_args(argc, argv, 1, 2, "workspace checkpoint NAME [LABEL]");
                if (r != 0)
                        return r;
                if (optind + 1 < argc)
                        label = argv[optind + 1];       /* checked by the daemon */
                else {
                        time_t now = time(NULL);

                        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime(&now));
                }
                if (call_void("CheckpointWorkspace", NULL, "ss", argv[optind], label) != EXIT_SUCCESS)
                        return EXIT_FAILURE;
                if (!arg_json)
                        printf("Checkpoint '%s' taken.\n", label);
                return EXIT_SUCCESS;
        }
        return usage_error("unknown workspace command '%s'", verb);
}

static const char *long_option_name(const struct option *options, int id) {
        for (; options->name; options++)
                if (options->val == id)
                        return options->name;
        return "?";
}

/* The options of a task (run, sandbox create) into a JSON document of
 * RunTask's options; with image, also --image. EXIT_SUCCESS or a usage
 * error. */
static int parse_task_options(int argc, char *argv[], json_t *doc, const char **image) {
        static const struct option options[] = {
                { "workdir", required_argument, NULL, 'w' },
                { "keep", no_argument, NULL, 'k' },
                { "name", required_argument, NULL, 'n' },
                { "timeout", required_argument, NULL, 't' },
                { "memory-max", required_argument, NULL, 'm' },
                { "disk-max", required_argument, NULL, 'D' },
                { "pids-max", required_argument, NULL, 'p' },
                { "cpu", required_argument, NULL, 'c' },
                { "io-read-bps", required_argument, NULL, 'R' },
                { "io-write-bps", required_argument, NULL, 'W' },
                { "io-weight", required_argument, NULL, 'G' },
                { "io-latency-us", required_argument, NULL, 'L' },
                { "image", required_argument, NULL, 'i' },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        static const struct { int id; const char *key; bool size; } numeric[] = {
                { 't', "timeout_sec", false }, { 'm', "memory_max", true }, { 'D', "disk_max", true },
                { 'p', "pids_max", false },
                { 'c', "cpu_percent", false }, { 'R', "io_read_bps", true }, { 'W', "io_write_bps", true },
                { 'G', "io_weight", false }, { 'L', "io_latency_us", false },
        };
        uint64_t v;
        int c;

        reset_getopt();
        while ((c = getopt_long(argc, argv, "+:h", options, NULL)) >= 0) {
                bool known = false;

                if (c == 'h')
                        return command_help(image ? "sandbox" : "run");
                if (c == 'w')
                        json_object_set_new(doc, "workdir", json_string(optarg)), known = true;
                else if (c == 'k' && !image)
                        json_object_set_new(doc, "keep", json_true()), known = true;
                else if (c == 'n' && !image)
                        json_object_set_new(doc, "name", json_string(optarg)), known = true;
                else if (c == 'i' && image)
                        *image = optarg, known = true;
                else if ((c == 'k' || c == 'n') && image)
                        /* A sandbox's snapshot is its own, sbx-NAME, kept until the sandbox is removed. */
                        return usage_error("%s is an option of run only: a sandbox keeps its own snapshot, "
                                           "sbx-NAME, until 'sandbox rm'", c == 'k' ? "--keep" : "--name");
                for (size_t i = 0; i < sizeof numeric / sizeof numeric[0]; i++) {
                        char *end = NULL;

                        if (numeric[i].id != c)
                                continue;
                        known = true;
                        errno = 0;
                        if (numeric[i].size ? parse_size(optarg, &v) < 0
                                            : (!isdigit((unsigned char) optarg[0]) ||
                                               ((v = strtoull(optarg, &end, 10)), errno || !end || *end)))
                                return usage_error("'%s' is not a valid number or size", optarg);
                        /* JSON numbers are signed: more would reach the daemon as a negative one. */
                        if (v > (uint64_t) INT64_MAX)
                                return usage_error("'%s' is too large for --%s", optarg, long_option_name(options, c));
                        json_object_set_new(doc, numeric[i].key, json_integer((json_int_t) v));
                }
                if (!known)
                        return option_error(image ? "sandbox create" : "run", c, argc, argv);
        }
        return EXIT_SUCCESS;
}

static void print_task_result(json_t *result) {
        json_t *out = json_object_get(result, "stdout"), *err = json_object_get(result, "stderr");
        char a[32];
        size_t i;
        json_t *n;

        /* Written whole: the output may hold NULs. */
        if (json_is_string(out))
                fwrite(json_string_value(out), 1, json_string_length(out), stdout);
        if (json_is_string(err))
                fwrite(json_string_value(err), 1, json_string_length(err), stderr);
        fprintf(stderr, PROGRAM ": exit status %" PRIu64 "%s%s%s; CPU %.2f s, peak memory %s\n",
                num(result, "exit_status"),
                json_is_true(json_object_get(result, "timed_out")) ? ", out of time" : "",
                json_is_true(json_object_get(result, "oom_killed")) ? ", out of memory" : "",
                json_is_true(json_object_get(result, "pids_limit_hit")) ? ", at its process limit" : "",
                (double) num(result, "cpu_usec") / 1e6, human_bytes(num(result, "memory_peak_bytes"), a));
        json_array_foreach(json_object_get(result, "not_applied"), i, n)
                fprintf(stderr, PROGRAM ": not applied: %s\n", json_string_value(n));
}

/* The command after "--" (or after the image). */
static char **command_words(int argc, char *argv[], int first) {
        if (first < argc && streq(argv[first], "--"))
                first++;
        return first < argc ? argv + first : NULL;
}

static int verb_run(int argc, char *argv[]) {
        _cleanup_bus_error_ sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_message_ sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_bus_ sd_bus *bus = NULL;
        _cleanup_free_ char *opts = NULL;
        json_t *doc = json_object(), *result = NULL;
        JobWait w = {};
        int r;

        r = parse_task_options(argc, argv, doc, NULL);
        if (r != EXIT_SUCCESS) {
                json_decref(doc);
                return r;
        }
        if (argc - optind < 2) {
                json_decref(doc);
                return usage_error("give an image and a command: run IMAGE -- COMMAND [ARG...]");
        }
        if (json_options(doc, &opts) < 0)
                return fail("out of memory");

        r = connect_bus(&bus);
        if (r != 0)
                return r;
        r = job_subscribe(bus, &w);
        if (r >= 0)
                r = sd_bus_message_new_method_call(bus, &m, API_SERVICE, API_MANAGER_PATH, API_MANAGER_INTERFACE,
                                                   "RunTask");
        if (r >= 0)
                r = sd_bus_message_append(m, "s", argv[optind]);
        if (r >= 0)
                r = sd_bus_message_append_strv(m, command_words(argc, argv, optind + 1));
        if (r >= 0)
                r = sd_bus_message_append(m, "s", opts);
        if (r >= 0)
                r = sd_bus_call(bus, m, 0, &error, &reply);
        if (r < 0)
                return bus_failure("run", r, &error);
        r = job_follow(bus, reply, &w, "running", NULL, &result);
        if (r != EXIT_SUCCESS)
                return r;

        if (arg_json) {
                json_dumpf(result, stdout, JSON_INDENT(2));
                putchar('\n');
        } else
                print_task_result(result);
        r = (int) num(result, "exit_status");
        json_decref(result);
        return r;
}

/* A run that failed before its task ran has a reason instead of an exit. */
static const char *run_error(json_t *result) {
        return json_string_value(json_object_get(result, "error"));
}

static void print_sandbox(json_t *v) {
        json_t *result = json_object_get(v, "result");
        char command[512] = "";
        size_t i;
        json_t *word;

        json_array_foreach(json_object_get(v, "command"), i, word)
                snprintf(command + strlen(command), sizeof command - strlen(command), "%s%s", i ? " " : "",
                         json_string_value(word));
        printf("Name:      %s\n", str(v, "name"));
        printf("State:     %s\n", str(v, "state"));
        printf("Image:     %s\n", str(v, "image"));
        printf("Snapshot:  %s\n", str(v, "snapshot"));
        printf("Command:   %s\n", command);
        if (run_error(result))
                printf("Error:     %s\n", run_error(result));
        else if (json_is_object(result))
                printf("Exit:      %" PRIu64 "%s\n", num(result, "exit_status"),
                       json_is_true(json_object_get(result, "timed_out")) ? " (out of time)" :
                       json_is_true(json_object_get(result, "oom_killed")) ? " (out of memory)" : "");
}

static void print_sandbox_table(json_t *list) {
        size_t i;
        json_t *v;

        printf("%-20s %-9s %-20s %s\n", "NAME", "STATE", "IMAGE", "EXIT");
        json_array_foreach(list, i, v) {
                json_t *result = json_object_get(v, "result");
                char exit_text[16] = "-";

                if (json_is_object(result) && !run_error(result))
                        snprintf(exit_text, sizeof exit_text, "%" PRIu64, num(result, "exit_status"));
                printf("%-20s %-9s %-20s %s\n", str(v, "name"), str(v, "state"), str(v, "image"), exit_text);
        }
}

static int verb_sandbox_create(int argc, char *argv[]) {
        _cleanup_bus_error_ sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_message_ sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_bus_ sd_bus *bus = NULL;
        _cleanup_free_ char *opts = NULL;
        json_t *doc = json_object();
        const char *image = NULL, *text, *name = argc > 1 ? argv[1] : NULL;
        int r;

        /* NAME comes first: the options follow it. */
        if (name && (streq(name, "--help") || streq(name, "-h")))
                r = command_help("sandbox");
        else if (!name || name[0] == '-')
                r = usage_error("give the sandbox's name first: sandbox create NAME --image IMAGE [LIMITS] -- "
                                "COMMAND [ARG...]");
        else
                r = parse_task_options(--argc, ++argv, doc, &image);
        if (r == EXIT_SUCCESS && (!image || argc - optind < 1))
                r = usage_error("usage: sandbox create NAME --image IMAGE [LIMITS] -- COMMAND [ARG...]");
        if (r != EXIT_SUCCESS) {
                json_decref(doc);
                return r;
        }
        if (json_options(doc, &opts) < 0)
                return fail("out of memory");
        r = connect_bus(&bus);
        if (r != 0)
                return r;
        r = sd_bus_message_new_method_call(bus, &m, API_SERVICE, API_MANAGER_PATH, API_MANAGER_INTERFACE,
                                           "CreateSandbox");
        if (r >= 0)
                r = sd_bus_message_append(m, "ss", name, image);
        if (r >= 0)
                r = sd_bus_message_append_strv(m, command_words(argc, argv, optind));
        if (r >= 0)
                r = sd_bus_message_append(m, "s", opts);
        if (r >= 0)
                r = sd_bus_call(bus, m, 0, &error, &reply);
        if (r >= 0)
                r = sd_bus_message_read(reply, "s", &text);
        if (r < 0)
                return bus_failure("CreateSandbox", r, &error);
        return print_json_text(text, print_sandbox);
}

/* WaitSandbox answers when the task ends: no timeout. */
static int verb_sandbox_wait(const char *name) {
        _cleanup_bus_error_ sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_message_ sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_bus_ sd_bus *bus = NULL;
        const char *text;
        json_t *doc, *result;
        int r;

        r = connect_bus(&bus);
        if (r != 0)
                return r;
        r = sd_bus_message_new_method_call(bus, &m, API_SERVICE, API_MANAGER_PATH, API_MANAGER_INTERFACE,
                                           "WaitSandbox");
        if (r >= 0)
                r = sd_bus_message_append(m, "s", name);
        if (r >= 0)
                r = sd_bus_call(bus, m, UINT64_MAX - 1, &error, &reply);
        /* Without a timeout, no reply means that the daemon left the bus. */
        if (r < 0 && sd_bus_error_has_name(&error, SD_BUS_ERROR_NO_REPLY)) {
                fail("sandbox '%s': cowboxd exited before its run ended; 'cowbox sandbox show %s' says how it "
                     "ended once cowboxd is back", name, name);
                return EXIT_UNAVAILABLE;
        }
        if (r >= 0)
                r = sd_bus_message_read(reply, "s", &text);
        if (r < 0)
                return bus_failure("WaitSandbox", r, &error);
        if (arg_json)
                return print_json_text(text, NULL);
        doc = parse_json(text);
        result = json_object_get(doc, "result");
        if (!json_is_object(result) || run_error(result)) {
                if (run_error(result))
                        r = fail("sandbox '%s' failed: %s", name, run_error(result));
                else if (streq(str(doc, "state"), "created"))
                        r = fail("sandbox '%s' has not been started: start it with '" PROGRAM " sandbox start %s'",
                                 name, name);
                else
                        r = fail("sandbox '%s' %s without a result", name, str(doc, "state"));
                json_decref(doc);
                return r;
        }
        print_task_result(result);
        r = (int) num(result, "exit_status");
        json_decref(doc);
        return r;
}

/* One sandbox of the daemon's list, printed as show prints it. */
static int verb_sandbox_show(const char *name) {
        json_t *list = NULL, *v, *found = NULL;
        size_t i;
        int r;

        r = call_for_json(&list, "ListSandboxes", NULL);
        if (r != EXIT_SUCCESS)
                return r;
        if (!json_is_array(list)) {
                json_decref(list);
                return fail("the daemon sent malformed JSON");
        }
        json_array_foreach(list, i, v) {
                const char *n = json_string_value(json_object_get(v, "name"));

                if (n && streq(n, name)) {
                        found = v;
                        break;
                }
        }
        if (found)
                print_json(found, print_sandbox);
        else
                r = fail("there is no sandbox '%s'; 'sandbox list' lists them", name);
        json_decref(list);
        return r;
}

static int verb_sandbox(int argc, char *argv[]) {
        const char *verb = argc > 1 ? argv[1] : "";

        if (argc < 2)
                return usage_error("no sandbox command given; give one of create, start, wait, kill, rm, list, "
                                   "show");
        argc--, argv++;
        if (streq(verb, "--help") || streq(verb, "-h"))
                return command_help("sandbox");
        if (streq(verb, "create"))
                return verb_sandbox_create(argc, argv);
        if (streq(verb, "list"))
                return verb_simple(argc, argv, 0, "sandbox list") ?:
                       call_json("ListSandboxes", print_sandbox_table, NULL);
        if (streq(verb, "show"))
                return verb_simple(argc, argv, 1, "sandbox show NAME") ?: verb_sandbox_show(argv[optind]);
        if (streq(verb, "start")) {
                int r = verb_simple(argc, argv, 1, "sandbox start NAME");
                if (r != 0)
                        return r;
                return call_void("StartSandbox", "Sandbox started.", "s", argv[optind]);
        }
        if (streq(verb, "wait"))
                return verb_simple(argc, argv, 1, "sandbox wait NAME") ?: verb_sandbox_wait(argv[optind]);
        if (streq(verb, "kill"))
                return verb_simple(argc, argv, 1, "sandbox kill NAME") ?:
                       call_void("KillSandbox", "Sandbox killed.", "s", argv[optind]);
        if (streq(verb, "rm"))
                return verb_simple(argc, argv, 1, "sandbox rm NAME") ?:
                       call_void("DeleteSandbox", "Sandbox removed.", "s", argv[optind]);
        return usage_error("unknown sandbox command '%s'", verb);
}

static int verb_scrub(void) {
        json_t *doc = NULL;
        bool damaged;
        int r;

        r = run_job("scrubbing", NULL, &doc, "Scrub", "");
        if (r != EXIT_SUCCESS)
                return r;
        if (arg_json) {
                json_dumpf(doc, stdout, JSON_INDENT(2));
                putchar('\n');
        } else
                print_scrub(doc);
        /* Damage is what a scrub exists to find: scripts must see it in the status. */
        damaged = num(doc, "blocks_damaged") > 0 || num(doc, "rows_damaged") > 0 || num(doc, "files_damaged") > 0;
        json_decref(doc);
        return damaged ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* The help's sections of commands; "cowbox COMMAND --help" prints the one
 * of its command, the nouns named first. */
static const struct {
        const char *nouns;
        const char *text;
} help_sections[] = {
        { " image ",
          "Images (read-only subvolumes, from btrfs send streams):\n"
          "  image receive [-f FILE] [NAME]    receive a stream (file or standard input)\n"
          "  image send [-p PARENT] [-f FILE] [--proto 1|2] [--compressed-data]\n"
          "             [--zstd] IMAGE\n"
          "                                    write a stream (file or standard output)\n"
          "  image list                        list the images\n"
          "  image show NAME                   show one image\n"
          "  image rename NAME NEW-NAME        rename an image\n"
          "  image rm NAME                     remove an image (the reaper frees it)\n" },
        { " list show create snapshot rename set-quota set-readonly rm ",
          "Subvolumes:\n"
          "  list                              list every subvolume\n"
          "  show NAME                         show one\n"
          "  create NAME                       create an empty, writable subvolume\n"
          "  snapshot [-r] SOURCE NAME         snapshot SOURCE (read-only with -r)\n"
          "  rename NAME NEW-NAME              rename a subvolume\n"
          "  set-quota NAME SIZE               limit its files' bytes (e.g. 20G, or none)\n"
          "  set-readonly NAME true|false      freeze it, or make it writable again\n"
          "  rm NAME                           delete a subvolume (the reaper frees it)\n" },
        { " run ",
          "Tasks:\n"
          "  run [--workdir PATH] [--keep] [--timeout SECONDS] [--memory-max SIZE]\n"
          "      [--disk-max SIZE] [--pids-max N] [--cpu PERCENT] [--io-read-bps SIZE]\n"
          "      [--io-write-bps SIZE] [--io-weight N] [--io-latency-us N] [--name NAME]\n"
          "      IMAGE -- COMMAND [ARG...]\n"
          "                                    snapshot IMAGE, run COMMAND in a sandbox\n"
          "                                    in it, report, delete the snapshot; exit\n"
          "                                    with the command's status\n" },
        { " sandbox ",
          "Sandboxes (a snapshot, a command and its limits, run when asked):\n"
          "  sandbox create NAME --image IMAGE [LIMITS] -- COMMAND [ARG...]\n"
          "                                    LIMITS: the options of run but --keep and\n"
          "                                    --name (its snapshot is sbx-NAME)\n"
          "  sandbox start NAME                start its command (again) in its snapshot\n"
          "  sandbox wait NAME                 wait for it; report; exit with its status\n"
          "  sandbox kill NAME                 kill its task\n"
          "  sandbox rm NAME                   delete it with its snapshot\n"
          "  sandbox list                      list them with their state\n"
          "  sandbox show NAME                 show one: its command, state and last exit\n" },
        { " workspace ",
          "Workspaces (a developer's writable snapshot of an image, mounted, limited):\n"
          "  workspace create NAME --image IMAGE [--owner USER] [--limit SIZE]\n"
          "                   [--path PATH]\n"
          "  workspace list | show NAME         list them, or show one with its space\n"
          "  workspace checkpoint NAME [LABEL]  a read-only snapshot to go back to\n"
          "  workspace checkpoints NAME         list the checkpoints\n"
          "  workspace restore NAME LABEL       return to a checkpoint (later work is lost)\n"
          "  workspace set-limit NAME SIZE      change the limit (e.g. 20G, or none)\n"
          "  workspace rm NAME                  unmount and remove it with its checkpoints\n" },
        { " status scrub reap jobs cancel ",
          "The store:\n"
          "  status                            space, reaper backlog, corruption, jobs\n"
          "  scrub                             verify every block (exit 1 if any damaged)\n"
          "  reap                              free what deleted subvolumes held, now\n"
          "  jobs                              list running jobs\n"
          "  cancel ID                         cancel a job\n" },
};

static void help_footer(void) {
        fputs("\n"
              "Options:\n"
              "  --json      print results as JSON (the daemon's documents, as they are)\n"
              "  --help      show this help; after a command, the help of its commands\n"
              "  --version   show the version\n"
              "\n"
              "Long work (receive, send, scrub, reap) shows its progress on a terminal.\n"
              "\n"
              "Exit status: 0 done; 1 failed (the message says why); 2 bad usage;\n"
              "69 cowboxd or the bus cannot be reached, or cowboxd went away during a job\n"
              "or a sandbox wait.\n", stdout);
}

static void help(void) {
        fputs("Usage: " PROGRAM " [--json] COMMAND [ARGS...]\n"
              "\n"
              "The client of cowboxd, which owns a copy-on-write store of images and\n"
              "subvolumes. It talks to cowboxd on the system bus (or the bus that\n"
              "$DBUS_SYSTEM_BUS_ADDRESS names). Changes need root or the group '" API_GROUP "'.\n", stdout);
        for (size_t i = 0; i < ELEMENTSOF(help_sections); i++)
                printf("\n%s", help_sections[i].text);
        help_footer();
        fputs("\n"
              "Examples:\n"
              "  btrfs send /mnt/images/base | " PROGRAM " image receive\n"
              "  " PROGRAM " snapshot base patch-1234 && ... && " PROGRAM " rm patch-1234\n"
              "  " PROGRAM " --json status\n", stdout);
}

static int command_help(const char *noun) {
        char word[64];

        snprintf(word, sizeof word, " %s ", noun);
        printf("Usage: " PROGRAM " [--json] %s ...\n", noun);
        for (size_t i = 0; i < ELEMENTSOF(help_sections); i++)
                if (strstr(help_sections[i].nouns, word))
                        printf("\n%s", help_sections[i].text);
        help_footer();
        return HELP_SHOWN;
}

static int dispatch(int argc, char *argv[]) {
        const char *noun = argv[0];

        if (streq(noun, "image")) {
                const char *verb = argc > 1 ? argv[1] : "";

                if (argc < 2)
                        return usage_error("no image command given; give one of receive, send, list, show, rename, "
                                           "rm");
                argc--, argv++;
                if (streq(verb, "--help") || streq(verb, "-h"))
                        return command_help("image");
                if (streq(verb, "receive"))
                        return verb_image_receive(argc, argv);
                if (streq(verb, "send"))
                        return verb_image_send(argc, argv);
                if (streq(verb, "list"))
                        return verb_simple(argc, argv, 0, "image list") ?: call_json("ListImages",
                                                                                     print_subvolume_table, NULL);
                if (streq(verb, "show"))
                        return verb_simple(argc, argv, 1, "image show NAME") ?:
                               call_json("GetSubvolume", print_subvolume, "s", argv[optind]);
                if (streq(verb, "rm"))
                        return verb_simple(argc, argv, 1, "image rm NAME") ?:
                               call_void("RemoveImage", "Image removed.", "s", argv[optind]);
                if (streq(verb, "rename"))
                        return verb_simple(argc, argv, 2, "image rename NAME NEW-NAME") ?:
                               call_void("Rename", "Image renamed.", "ss", argv[optind], argv[optind + 1]);
                return usage_error("unknown image command '%s'", verb);
        }
        if (streq(noun, "workspace"))
                return verb_workspace(argc, argv);
        if (streq(noun, "run"))
                return verb_run(argc, argv);
        if (streq(noun, "sandbox"))
                return verb_sandbox(argc, argv);
        if (streq(noun, "list"))
                return verb_simple(argc, argv, 0, "list") ?: call_json("ListSubvolumes", print_subvolume_table, NULL);
        if (streq(noun, "show"))
                return verb_simple(argc, argv, 1, "show NAME") ?:
                       call_json("GetSubvolume", print_subvolume, "s", argv[optind]);
        if (streq(noun, "snapshot"))
                return verb_snapshot(argc, argv);
        if (streq(noun, "rm"))
                return verb_simple(argc, argv, 1, "rm NAME") ?:
                       call_void("DeleteSubvolume", "Subvolume deleted.", "s", argv[optind]);
        if (streq(noun, "create"))
                return verb_simple(argc, argv, 1, "create NAME") ?:
                       call_void("CreateSubvolume", "Subvolume created.", "s", argv[optind]);
        if (streq(noun, "rename"))
                return verb_simple(argc, argv, 2, "rename NAME NEW-NAME") ?:
                       call_void("Rename", "Subvolume renamed.", "ss", argv[optind], argv[optind + 1]);
        if (streq(noun, "set-quota")) {
                uint64_t bytes;

                int r = verb_simple(argc, argv, 2, "set-quota NAME SIZE");
                if (r != 0)
                        return r;
                if (parse_size(argv[optind + 1], &bytes) < 0)
                        return usage_error("'%s' is not a size (e.g. 20G, or none)", argv[optind + 1]);
                return call_void("SetQuota", "Quota set.", "st", argv[optind], bytes);
        }
        if (streq(noun, "set-readonly")) {
                const char *value;
                int readonly;

                int r = verb_simple(argc, argv, 2, "set-readonly NAME true|false");
                if (r != 0)
                        return r;
                value = argv[optind + 1];
                readonly = parse_boolean(value);
                if (readonly < 0)
                        return usage_error("'%s' is neither true nor false", value);
                return call_void("SetReadOnly", readonly ? "Subvolume is read-only." : "Subvolume is writable.",
                                 "sb", argv[optind], readonly);
        }
        if (streq(noun, "status"))
                return verb_simple(argc, argv, 0, "status") ?: call_json("GetStatus", print_status, NULL);
        if (streq(noun, "jobs"))
                return verb_simple(argc, argv, 0, "jobs") ?: call_json("ListJobs", print_job_table, NULL);
        if (streq(noun, "scrub"))
                return verb_simple(argc, argv, 0, "scrub") ?: verb_scrub();
        if (streq(noun, "reap"))
                return verb_simple(argc, argv, 0, "reap") ?: run_job("reaping", print_reap, NULL, "Reap", "");
        if (streq(noun, "cancel")) {
                char *end = NULL;
                unsigned long id;

                int r = verb_simple(argc, argv, 1, "cancel ID");
                if (r != 0)
                        return r;
                id = strtoul(argv[optind], &end, 10);
                if (!end || *end || id == 0 || id > UINT32_MAX)
                        return usage_error("'%s' is not a job id", argv[optind]);
                return call_void("CancelJob", "Job cancelled.", "u", (uint32_t) id);
        }
        return usage_error("unknown command '%s'", noun);
}

int main(int argc, char *argv[]) {
        int i, r;

        /* Global options come before the command. */
        for (i = 1; i < argc && argv[i][0] == '-'; i++) {
                if (streq(argv[i], "--json"))
                        arg_json = true;
                else if (streq(argv[i], "--help") || streq(argv[i], "-h")) {
                        help();
                        return EXIT_SUCCESS;
                } else if (streq(argv[i], "--version")) {
                        puts(PROGRAM " " COWBOX_VERSION);
                        return EXIT_SUCCESS;
                } else
                        return usage_error("unknown option '%s'", argv[i]);
        }
        if (i >= argc)
                return usage_error("no command given");
        r = dispatch(argc - i, argv + i);
        return r == HELP_SHOWN ? EXIT_SUCCESS : r;
}
