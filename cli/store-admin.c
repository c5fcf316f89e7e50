/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * cowbox-store's commands on the store as a whole: init, usage, mount, reap,
 * scrub and fsck.
 */

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store-tool.h"

/* ---- init ---- */

typedef struct InitResult {
        const char *path;
} InitResult;

static const Field init_fields[] = {
        FIELD("Created store", "path", FIELD_STRING, InitResult, path),
        {}
};

static int verb_init(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        InitResult result = { .path = tool->store_path };
        int c, r;

        c = command_getopt(tool, cmd, argc, argv);
        if (c != 0)
                return options_exit_status(c);
        r = command_check_arguments(cmd, argc, argv, 0, 0);
        if (r != 0)
                return r;

        r = store_init(result.path);
        switch (r) {
        case -EEXIST:
                return report_failure("there already is a store at %s; use it, or give another "
                                      "directory with --store", result.path);
        case -ENOTEMPTY:
                return report_failure("%s is not empty; a new store needs an empty or missing "
                                      "directory (give one with --store)", result.path);
        case -EACCES:
        case -EPERM:
                return report_failure("no permission to create a store at %s; run as a user who may "
                                      "write there (usually root)", result.path);
        }
        if (r < 0)
                return report_failure("cannot create a store at %s: %s", result.path, error_text(r));

        if (tool->json) {
                _cleanup_json_ json_t *doc = record_to_json(init_fields, &result);
                return json_print(doc);
        }
        printf("Created an empty store at %s.\n", result.path);
        return EXIT_SUCCESS;
}

/* ---- usage ---- */

/* logical / stored, the factor compression and deduplication save; NaN
 * (shown as "-") when there is nothing to compare: no file data (the
 * metadata of empty trees would make it 0.00x), or nothing stored. */
static double space_ratio(uint64_t logical, uint64_t stored) {
        return logical > 0 && stored > 0 ? (double) logical / (double) stored : NAN;
}

typedef struct UsageRow {
        const char *name;
        uint64_t logical_bytes;
        uint64_t stored_bytes;
        uint64_t exclusive_bytes;
        double ratio;
} UsageRow;

static const Field usage_row_fields[] = {
        FIELD("Name", "name", FIELD_STRING, UsageRow, name),
        FIELD("Logical", "logical_bytes", FIELD_BYTES, UsageRow, logical_bytes),
        FIELD("Stored", "stored_bytes", FIELD_BYTES, UsageRow, stored_bytes),
        FIELD("Exclusive", "exclusive_bytes", FIELD_BYTES, UsageRow, exclusive_bytes),
        FIELD("Ratio", "compression_ratio", FIELD_RATIO, UsageRow, ratio),
        {}
};

typedef struct UsageTotals {
        StoreUsage usage;
        uint64_t exclusive_bytes;       /* the sum over the subvolumes */
        double ratio;
} UsageTotals;

static const Field usage_total_fields[] = {
        FIELD("Logical", "logical_bytes", FIELD_BYTES, UsageTotals, usage.logical_bytes),
        FIELD("Stored", "stored_bytes", FIELD_BYTES, UsageTotals, usage.stored_bytes),
        FIELD("  Data", "data_bytes", FIELD_BYTES, UsageTotals, usage.data_bytes),
        FIELD("  Metadata", "metadata_bytes", FIELD_BYTES, UsageTotals, usage.metadata_bytes),
        FIELD("Exclusive", "exclusive_bytes", FIELD_BYTES, UsageTotals, exclusive_bytes),
        FIELD("Compression ratio", "compression_ratio", FIELD_RATIO, UsageTotals, ratio),
        FIELD("Pack files", "pack_file_bytes", FIELD_BYTES, UsageTotals, usage.pack_file_bytes),
        FIELD("Reclaimable", "reclaimable_bytes", FIELD_BYTES, UsageTotals, usage.space.reclaimable_bytes),
        FIELD("Data blocks", "blocks", FIELD_U64, UsageTotals, usage.blocks),
        FIELD("Subvolumes", "subvolumes", FIELD_U64, UsageTotals, usage.subvolumes),
        FIELD("  Damaged", "damaged_subvolumes", FIELD_U64, UsageTotals, usage.damaged_subvolumes),
        FIELD("Deleted subvolumes", "deleted_subvolumes", FIELD_U64, UsageTotals, usage.deleted_subvolumes),
        FIELD("Layers", "layers", FIELD_U64, UsageTotals, usage.layers),
        FIELD("Corruption events", "corruption_events", FIELD_U64, UsageTotals, usage.corruption_events),
        FIELD("Host free space", "fs_free_bytes", FIELD_BYTES, UsageTotals, usage.space.fs_free_bytes),
        FIELD("Host file system size", "fs_total_bytes", FIELD_BYTES, UsageTotals, usage.space.fs_total_bytes),
        FIELD("Cleanup reserve", "reserve_bytes", FIELD_BYTES, UsageTotals, usage.space.reserve_bytes),
        {}
};

/* One row per subvolume; the rows borrow the names from list. */
static UsageRow *usage_rows_new(const StoreSubvolumeInfo *infos, size_t n, UsageTotals *totals) {
        UsageRow *rows = calloc(MAX(n, (size_t) 1), sizeof(UsageRow));

        if (!rows)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                const StoreSubvolumeInfo *info = &infos[i];

                rows[i] = (UsageRow) {
                        .name = info->name,
                        .logical_bytes = info->logical_bytes,
                        .stored_bytes = info->referenced_bytes,
                        .exclusive_bytes = info->exclusive_bytes,
                        .ratio = space_ratio(info->logical_bytes, info->referenced_bytes),
                };
                totals->exclusive_bytes += info->exclusive_bytes;
        }
        totals->ratio = space_ratio(totals->usage.logical_bytes, totals->usage.stored_bytes);
        return rows;
}

static int print_usage(const Tool *tool, const char *path, const UsageRow *rows, size_t n,
                       const UsageTotals *totals) {
        if (tool->json) {
                _cleanup_json_ json_t *doc = json_object();

                if (!json_add(doc, "store", json_string_lossy(path)) ||
                    !json_add(doc, "subvolumes", records_to_json(usage_row_fields, rows, sizeof(UsageRow), n)) ||
                    !json_add(doc, "total", record_to_json(usage_total_fields, totals)))
                        return json_print(NULL);
                return json_print(doc);
        }

        printf("Store: %s\n\n", path);
        if (n > 0) {
                records_print(tool, usage_row_fields, rows, sizeof(UsageRow), n);
                putchar('\n');
        }
        fputs("Total:\n", stdout);
        record_print(tool, usage_total_fields, totals, 2);
        return EXIT_SUCCESS;
}

static int verb_usage(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        _cleanup_(subvolume_list_done) SubvolumeList list = {};
        _cleanup_store_ Store *store = NULL;
        _cleanup_free_ UsageRow *rows = NULL;
        UsageTotals totals = {};
        size_t sound;
        int c, r;

        c = command_getopt(tool, cmd, argc, argv);
        if (c != 0)
                return options_exit_status(c);
        r = command_check_arguments(cmd, argc, argv, 0, 0);
        if (r != 0)
                return r;

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;

        r = store_usage_listed(store, &totals.usage, &list.items, &list.n);
        if (r < 0)
                return report_failure("cannot measure the space of %s: %s", store_path(store), error_text(r));

        /* The space of a damaged one is not known: it has no row. */
        sound = subvolume_list_damaged_last(&list);
        rows = usage_rows_new(list.items, sound, &totals);
        if (!rows)
                return report_failure("out of memory");

        r = print_usage(tool, store_path(store), rows, sound, &totals);
        if (report_damaged_subvolumes(list.items + sound, list.n - sound) != EXIT_SUCCESS)
                return EXIT_FAILURE;
        return r;
}

/* ---- mount ---- */

/* Checked here, before the store is involved, so that -ENOENT from the
 * library can only mean the subvolume. */
static int check_mountpoint(const char *mountpoint) {
        struct stat st;

        if (stat(mountpoint, &st) < 0) {
                if (errno == ENOENT)
                        return report_failure("mount point %s does not exist; create it with 'mkdir -p %s'",
                                              mountpoint, mountpoint);
                if (errno == ENOTCONN)
                        return report_failure("%s is a FUSE mount whose server is gone; unmount it with "
                                              "'fusermount3 -u %s' first", mountpoint, mountpoint);
                return report_failure("cannot use %s as a mount point: %m", mountpoint);
        }
        if (!S_ISDIR(st.st_mode))
                return report_failure("mount point %s is not a directory", mountpoint);
        return EXIT_SUCCESS;
}

static int report_mount_error(int error, const char *name, const char *mountpoint, pid_t holder) {
        switch (error) {
        case -ENOENT:
                return report_no_subvolume(name);
        case -EBUSY:
                return report_subvolume_busy(name, holder, "unmount the other mount first (fusermount3 -u "
                                             "MOUNTPOINT), or mount both with --read-only");
        case -ENOTCONN:
                return report_failure("%s is a FUSE mount whose server is gone; unmount it with "
                                      "'fusermount3 -u %s' first", mountpoint, mountpoint);
        case -EACCES:
        case -EPERM:
                return report_failure("no permission to mount at %s (%s); FUSE needs /dev/fuse, "
                                      "fusermount3, and a mount point you may write", mountpoint,
                                      error_text(error));
        default:
                return report_failure("cannot mount subvolume '%s' at %s: %s", name, mountpoint,
                                      error_text(error));
        }
}

/* Opens the store and serves the mount; reports what went wrong itself. */
static int mount_and_serve(const Tool *tool, const char *name, const char *mountpoint,
                           const StoreMountOptions *opts) {
        _cleanup_store_ Store *store = NULL;
        pid_t holder = 0;
        int r;

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;
        r = store_mount(store, name, mountpoint, opts, &holder);
        if (r < 0)
                return report_mount_error(r, name, mountpoint, holder);
        return EXIT_SUCCESS;
}

/* The server is a child that leaves the terminal once the mount is ready;
 * until then it reports its own errors, as in the foreground. Only the
 * child opens the store: a store opened before fork() would be of no use
 * to it (SQLite connections do not survive fork), and opening it twice
 * would only make the mount slower. */
static int mount_in_background(const Tool *tool, const char *name, const char *mountpoint,
                               StoreMountOptions *opts) {
        _cleanup_close_ int rfd = -EBADF;
        int fds[2], status;
        char word[2];
        ssize_t n;
        pid_t pid;

        if (pipe2(fds, O_CLOEXEC) < 0)
                return report_failure("cannot create a pipe: %m");
        rfd = fds[0];
        pid = fork();
        if (pid < 0) {
                safe_close(fds[1]);
                return report_failure("cannot start the server: %m");
        }
        if (pid == 0) {
                rfd = safe_close(rfd);
                opts->ready_fd = fds[1];
                opts->detach = true;
                _exit(mount_and_serve(tool, name, mountpoint, opts));
        }
        safe_close(fds[1]);

        do
                n = read(rfd, word, sizeof word);
        while (n < 0 && errno == EINTR);
        if (n > 0 && word[0] == '1') {
                printf("Mounted subvolume '%s' at %s; unmount it with 'fusermount3 -u %s'.\n",
                       name, mountpoint, mountpoint);
                return EXIT_SUCCESS;
        }

        /* It failed, and said why. */
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return report_failure("cannot wait for the server: %m");
        if (WIFEXITED(status) && WEXITSTATUS(status) != EXIT_SUCCESS)
                return WEXITSTATUS(status);
        if (WIFSIGNALED(status))
                return report_failure("the server of '%s' was killed by signal %s before the mount was ready",
                                      name, sigabbrev_np(WTERMSIG(status)) ?: "?");
        return report_failure("the server of '%s' exited before the mount was ready", name);
}

static int verb_mount(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        StoreMountOptions opts = { .ready_fd = -1 };
        const char *name, *mountpoint;
        bool background = false;
        int c, r;

        while ((c = command_getopt(tool, cmd, argc, argv)) > 0)
                switch (c) {
                case ARG_BACKGROUND:
                        background = true;
                        break;
                case ARG_READ_ONLY:
                        opts.readonly = true;
                        break;
                case ARG_DEBUG:
                        opts.debug = true;
                        break;
                }
        if (c < 0)
                return options_exit_status(c);

        r = command_check_arguments(cmd, argc, argv, 2, 2);
        if (r != 0)
                return r;
        name = argv[optind];
        mountpoint = argv[optind + 1];
        r = command_check_name(cmd, name);
        if (r != 0)
                return r;
        r = check_mountpoint(mountpoint);
        if (r != 0)
                return r;

        if (background)
                return mount_in_background(tool, name, mountpoint, &opts);
        return mount_and_serve(tool, name, mountpoint, &opts);
}

/* ---- reap ---- */

static const Field reap_fields[] = {
        FIELD("Subvolumes forgotten", "subvolumes_forgotten", FIELD_U64, StoreReapStats, subvolumes_forgotten),
        FIELD("Layers dropped", "layers_dropped", FIELD_U64, StoreReapStats, layers_dropped),
        FIELD("Layers folded", "layers_folded", FIELD_U64, StoreReapStats, layers_folded),
        FIELD("Blocks freed", "blocks_freed", FIELD_U64, StoreReapStats, blocks_freed),
        FIELD("Space freed", "bytes_freed", FIELD_BYTES, StoreReapStats, bytes_freed),
        {}
};

static const Field reaper_settings_fields[] = {
        FIELD("Reaper paused", "paused", FIELD_BOOL, StoreReaperSettings, paused),
        FIELD("Reaper rate limit per second", "rate_bytes_per_sec", FIELD_LIMIT, StoreReaperSettings, rate_bytes_per_sec),
        FIELD("Rate lifted (disk nearly full)", "hurried", FIELD_BOOL, StoreReaperSettings, hurried),
        {}
};

/* --pause, --resume and --rate change what every reaper does, and print it. */
static int reaper_configure(Tool *tool, Store *store, int pause, const char *rate, uint64_t bytes) {
        StoreReaperSettings settings;
        int r = 0;

        if (pause >= 0)
                r = store_reaper_set_paused(store, pause);
        if (r >= 0 && rate)
                r = store_reaper_set_rate(store, bytes);
        if (r >= 0)
                r = store_reaper_settings(store, &settings);
        if (r < 0)
                return report_failure("cannot change the reaper's settings in %s: %s", store_path(store),
                                      error_text(r));
        if (tool->json) {
                _cleanup_json_ json_t *doc = record_to_json(reaper_settings_fields, &settings);
                return json_print(doc);
        }
        record_print(tool, reaper_settings_fields, &settings, 0);
        return EXIT_SUCCESS;
}

static void on_reap_progress(uint64_t done, uint64_t total, void *userdata) {
        bool *shown = userdata;

        progress_show("reap", done, total);
        *shown = true;
}

static int verb_reap(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        _cleanup_store_ Store *store = NULL;
        StoreReapStats stats = {};
        const char *rate = NULL;
        uint64_t rate_bytes = 0;
        pid_t holder = 0;
        bool wait = false, progress_shown = false;
        int c, r, pause = -1;

        while ((c = command_getopt(tool, cmd, argc, argv)) > 0)
                switch (c) {
                case ARG_WAIT:
                        wait = true;
                        break;
                case ARG_PAUSE:
                case ARG_RESUME:
                        if (pause >= 0 && pause != (c == ARG_PAUSE))
                                return report_usage_error(cmd, "--pause and --resume contradict each other");
                        pause = c == ARG_PAUSE;
                        break;
                case ARG_RATE:
                        rate = optarg;
                        r = parse_size(rate, &rate_bytes);
                        /* The store keeps it as a signed 64-bit integer. */
                        if (r == -ERANGE || (r >= 0 && rate_bytes > (uint64_t) INT64_MAX))
                                return report_usage_error(cmd, "'%s' is too large a rate: at most %" PRIi64
                                                          " bytes per second", rate, INT64_MAX);
                        if (r < 0)
                                return report_usage_error(cmd, "'%s' is not a rate: give bytes per second, "
                                                          "optionally with K, M, G or T (powers of 1024), or "
                                                          "'none'", rate);
                        break;
                }
        if (c < 0)
                return options_exit_status(c);
        r = command_check_arguments(cmd, argc, argv, 0, 0);
        if (r != 0)
                return r;
        if (wait && (pause >= 0 || rate))
                return report_usage_error(cmd, "--wait reaps; --pause, --resume and --rate only change settings");

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;
        if (pause >= 0 || rate)
                return reaper_configure(tool, store, pause, rate, rate_bytes);

        r = store_reap(store, wait, progress_wanted() ? on_reap_progress : NULL, &progress_shown, &stats, &holder);
        if (progress_shown)
                progress_clear();
        if (r == -EBUSY && !wait) {
                char process[PROCESS_DESCRIPTION_MAX];

                /* fsck and scrub hold the reaper's lock too; with --wait
                 * the lock was waited for, and the store was busy in
                 * another way. */
                return report_failure("another reaper, fsck or scrub is running in %s; wait for it with '"
                                      PROGRAM_NAME " reap --wait'", describe_process(holder, process));
        }
        if (r == -EAGAIN)
                return report_failure("the reaper of %s is paused; resume it with '" PROGRAM_NAME " reap --resume'",
                                      store_path(store));
        if (r == -EBUSY)
                return report_failure("cannot reap %s: another process kept its catalog or a layer's database "
                                      "locked for too long; what was freed stays freed, try again",
                                      store_path(store));
        if (r < 0)
                return report_failure("cannot reap %s: %s", store_path(store), error_text(r));

        if (tool->json) {
                _cleanup_json_ json_t *doc = record_to_json(reap_fields, &stats);
                return json_print(doc);
        }
        record_print(tool, reap_fields, &stats, 0);
        return EXIT_SUCCESS;
}

/* ---- scrub ---- */

static const Field damage_fields[] = {
        FIELD("Subvolume", "subvolume", FIELD_STRING, StoreDamage, subvolume),
        FIELD("Path", "path", FIELD_STRING, StoreDamage, path),
        FIELD("Problem", "reason", FIELD_STRING, StoreDamage, reason),
        FIELD("Pack", "pack", FIELD_U64, StoreDamage, pack),
        FIELD("Offset", "offset", FIELD_U64, StoreDamage, offset),
        FIELD("Block digest", "digest", FIELD_CHARS, StoreDamage, digest),
        {}
};

static const Field scrub_fields[] = {
        FIELD("Blocks checked", "blocks_checked", FIELD_U64, StoreScrubStats, blocks_checked),
        FIELD("Data checked", "bytes_checked", FIELD_BYTES, StoreScrubStats, bytes_checked),
        FIELD("Damaged blocks", "blocks_damaged", FIELD_U64, StoreScrubStats, blocks_damaged),
        FIELD("Damaged files", "files_damaged", FIELD_U64, StoreScrubStats, files_damaged),
        FIELD("Records checked", "rows_checked", FIELD_U64, StoreScrubStats, rows_checked),
        FIELD("Damaged records", "rows_damaged", FIELD_U64, StoreScrubStats, rows_damaged),
        {}
};

typedef struct ScrubReport {
        const Tool *tool;
        json_t *damage;         /* with --json: collected, printed at the end */
        uint64_t n_reported;
        bool out_of_memory;
        bool progress_shown;    /* a progress line is on the terminal */
} ScrubReport;

static void on_scrub_progress(uint64_t done, uint64_t total, void *userdata) {
        ScrubReport *report = userdata;

        progress_show("scrub", done, total);
        report->progress_shown = true;
}

static void scrub_progress_clear(ScrubReport *report) {
        if (report->progress_shown)
                progress_clear();
        report->progress_shown = false;
}

/* In text, each damaged block is printed as soon as it is found: a scrub
 * can take hours, and what it found so far is worth having. */
static void on_damage(const StoreDamage *d, void *userdata) {
        ScrubReport *report = userdata;

        report->n_reported++;
        if (report->tool->json) {
                if (json_array_append_new(report->damage, record_to_json(damage_fields, d)) < 0)
                        report->out_of_memory = true;
                return;
        }

        scrub_progress_clear(report);
        printf("%sDamaged %s:\n", report->n_reported > 1 ? "\n" : "", d->pack > 0 ? "block" : "record");
        record_print(report->tool, damage_fields, d, 2);
        fflush(stdout);
}

static int print_scrub_summary(const ScrubReport *report, const StoreScrubStats *stats) {
        if (report->tool->json) {
                _cleanup_json_ json_t *doc = json_object();

                if (report->out_of_memory ||
                    !json_add(doc, "damage", json_incref(report->damage)) ||
                    !json_add(doc, "summary", record_to_json(scrub_fields, stats)))
                        return json_print(NULL);
                return json_print(doc);
        }

        if (report->n_reported > 0)
                putchar('\n');
        record_print(report->tool, scrub_fields, stats, 0);
        if (stats->blocks_damaged > 0 || stats->rows_damaged > 0 || report->n_reported > 0)
                puts("\nThe store has damaged blocks or records: reading the files listed above fails with EIO.\n"
                     "Replace them from a good copy, or delete the subvolumes that hold them.");
        else
                puts("\nNo damage found.");
        return EXIT_SUCCESS;
}

static int verb_scrub(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        _cleanup_store_ Store *store = NULL;
        _cleanup_json_ json_t *damage = NULL;
        StoreScrubStats stats = {};
        ScrubReport report = { .tool = tool };
        int c, r;

        c = command_getopt(tool, cmd, argc, argv);
        if (c != 0)
                return options_exit_status(c);
        r = command_check_arguments(cmd, argc, argv, 0, 0);
        if (r != 0)
                return r;

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;

        if (tool->json) {
                damage = json_array();
                if (!damage)
                        return report_failure("out of memory");
                report.damage = damage;
        }

        r = store_scrub(store, on_damage, progress_wanted() ? on_scrub_progress : NULL, &report, &stats);
        scrub_progress_clear(&report);
        if (r < 0)
                return report_failure("scrub of %s stopped: %s", store_path(store), error_text(r));

        r = print_scrub_summary(&report, &stats);
        if (r != EXIT_SUCCESS)
                return r;
        /* Damage is what a scrub exists to find: scripts must see it in the status. */
        return stats.blocks_damaged > 0 || stats.rows_damaged > 0 || report.n_reported > 0 ? EXIT_FAILURE
                                                                                          : EXIT_SUCCESS;
}

/* ---- fsck ---- */

typedef struct FsckSummary {
        uint64_t found;
        uint64_t repaired;
        uint64_t unrepaired;
        bool repair;
} FsckSummary;

static const Field fsck_fields[] = {
        FIELD("Problems found", "problems_found", FIELD_U64, FsckSummary, found),
        FIELD("Repaired", "problems_repaired", FIELD_U64, FsckSummary, repaired),
        FIELD("Left unrepaired", "problems_unrepaired", FIELD_U64, FsckSummary, unrepaired),
        FIELD("Repair asked", "repair", FIELD_BOOL, FsckSummary, repair),
        {}
};

typedef struct FsckReport {
        const Tool *tool;
        json_t *problems;       /* with --json */
        uint64_t n_found;
        bool out_of_memory;
        bool progress_shown;    /* a progress line is on the terminal */
} FsckReport;

static void on_fsck_progress(uint64_t done, uint64_t total, void *userdata) {
        FsckReport *report = userdata;

        progress_show("fsck", done, total);
        report->progress_shown = true;
}

static void fsck_progress_clear(FsckReport *report) {
        if (report->progress_shown)
                progress_clear();
        report->progress_shown = false;
}

static void on_problem(const char *what, void *userdata) {
        FsckReport *report = userdata;

        report->n_found++;
        if (report->tool->json) {
                if (json_array_append_new(report->problems, json_string_lossy(what)) < 0)
                        report->out_of_memory = true;
                return;
        }
        fsck_progress_clear(report);
        printf("Problem: %s\n", what);
        fflush(stdout);
}

static void print_fsck_advice(const FsckSummary *summary) {
        if (summary->found == 0)
                puts("No problems found.");
        else if (summary->unrepaired == 0)
                puts("Every problem found was repaired.");
        else if (!summary->repair)
                puts("Run '" PROGRAM_NAME " fsck --repair' to repair what can be repaired without losing data.");
        else
                puts("The problems left cannot be repaired without losing data: copy what you need out\n"
                     "of the subvolumes they name, then delete those subvolumes.");
}

static int print_fsck_summary(const FsckReport *report, const FsckSummary *summary) {
        if (report->tool->json) {
                _cleanup_json_ json_t *doc = record_to_json(fsck_fields, summary);

                if (report->out_of_memory || !json_add(doc, "problems", json_incref(report->problems)))
                        return json_print(NULL);
                return json_print(doc);
        }

        if (report->n_found > 0)
                putchar('\n');
        record_print(report->tool, fsck_fields, summary, 0);
        putchar('\n');
        print_fsck_advice(summary);
        return EXIT_SUCCESS;
}

static int verb_fsck(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        _cleanup_store_ Store *store = NULL;
        _cleanup_json_ json_t *problems = NULL;
        FsckReport report = { .tool = tool };
        FsckSummary summary = {};
        int c, r;

        while ((c = command_getopt(tool, cmd, argc, argv)) > 0)
                if (c == ARG_REPAIR)
                        summary.repair = true;
        if (c < 0)
                return options_exit_status(c);
        r = command_check_arguments(cmd, argc, argv, 0, 0);
        if (r != 0)
                return r;

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;

        if (tool->json) {
                problems = json_array();
                if (!problems)
                        return report_failure("out of memory");
                report.problems = problems;
        }

        r = store_fsck(store, summary.repair, on_problem, progress_wanted() ? on_fsck_progress : NULL, &report);
        fsck_progress_clear(&report);
        if (r == -EBUSY && summary.repair)
                return report_failure("fsck --repair of %s: a subvolume is mounted, and repairs change layers "
                                      "that nobody may serve meanwhile; unmount it (see MOUNTED BY in '"
                                      PROGRAM_NAME " subvolume list') and try again", store_path(store));
        if (r < 0)
                return report_failure("fsck of %s stopped: %s", store_path(store), error_text(r));

        summary.found = MAX(report.n_found, (uint64_t) r);
        summary.unrepaired = (uint64_t) r;
        summary.repaired = summary.repair ? summary.found - summary.unrepaired : 0;

        r = print_fsck_summary(&report, &summary);
        if (r != EXIT_SUCCESS)
                return r;
        return summary.unrepaired > 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ---- the commands ---- */

const Command command_init = {
        .name = "init",
        .synopsis = "",
        .summary = "Create an empty store.",
        .description =
                "Creates the store in the directory that --store or $COWBOX_STORE names (else\n"
                STORE_DEFAULT_PATH "). The directory is created if missing, and must be empty.\n",
        .examples = (const char *const[]) {
                PROGRAM_NAME " init",
                PROGRAM_NAME " --store=/srv/cowbox init",
                NULL,
        },
        .flags = COMMAND_JSON,
        .run = verb_init,
};

const Command command_usage = {
        .name = "usage",
        .synopsis = "[--raw]",
        .summary = "Show how the store uses space, per subvolume and in total.",
        .description =
                "For each subvolume: logical, what its files hold; stored, what its layers take\n"
                "on disk after compression and deduplication (shared data counts for each\n"
                "subvolume that shares it); exclusive, what deleting it would free; and the ratio\n"
                "logical/stored. The total gives the store's logical and stored bytes (data and\n"
                "metadata), the sum of the exclusive bytes, the ratio, the size of the pack\n"
                "files, what the next reap frees (reclaimable), the checksum mismatches seen so\n"
                "far, and the space of the host file system. With --json, sizes are in bytes and\n"
                "a ratio without file data or nothing stored is null. A subvolume with a damaged\n"
                "record (see 'subvolume list') has no row, is counted among the damaged, and is\n"
                "named on standard error; the exit status is then 1.\n",
        .examples = (const char *const[]) {
                PROGRAM_NAME " usage",
                PROGRAM_NAME " usage --raw",
                PROGRAM_NAME " --json usage",
                NULL,
        },
        .flags = COMMAND_JSON | COMMAND_SIZES,
        .run = verb_usage,
};

const Command command_mount = {
        .name = "mount",
        .synopsis = "[--background] [--read-only] [--debug] NAME MOUNTPOINT",
        .summary = "Mount a subvolume through FUSE and serve it until it is unmounted.",
        .description =
                "Without --background, the command serves the mount in the foreground until it\n"
                "is unmounted with 'fusermount3 -u MOUNTPOINT', or until it gets SIGTERM or\n"
                "SIGINT (Ctrl-C). A writable subvolume is mounted writable by one process at\n"
                "a time, or read-only (--read-only) by any number; a read-only subvolume is\n"
                "always mounted read-only. A mounted subvolume cannot be deleted; it can be\n"
                "snapshotted. MOUNTPOINT must be an existing directory.\n",
        .options = (const CommandOption[]) {
                { ARG_BACKGROUND, "background", NULL, "return once the mount is ready, and serve it\n"
                  "from a background process, which logs to the file 'log'\n"
                  "of the store" },
                { ARG_READ_ONLY, "read-only", NULL, "mount a writable subvolume read-only" },
                { ARG_DEBUG, "debug", NULL, "print libfuse's debug output on standard error" },
                {}
        },
        .examples = (const char *const[]) {
                PROGRAM_NAME " mount --background base /mnt/base",
                PROGRAM_NAME " mount --read-only base-v1 /mnt/base-v1",
                "fusermount3 -u /mnt/base",
                NULL,
        },
        .run = verb_mount,
};

const Command command_reap = {
        .name = "reap",
        .synopsis = "[--wait] [--raw] | --pause | --resume | --rate BYTES",
        .summary = "Free the space of deleted subvolumes now, and print what was freed.",
        .description =
                "The reaper forgets deleted subvolumes, folds each layer that has a single child\n"
                "into it, drops the layers nothing uses and frees the blocks nothing references.\n"
                "'subvolume delete' starts it in the background; this runs it in the foreground.\n"
                "Only one reaper runs at a time, and none while fsck or scrub runs: if one of\n"
                "them is running, reap fails and names it, unless --wait is given. On a\n"
                "terminal, a line on standard error shows the bytes freed, of those waiting to\n"
                "be (an estimate).\n"
                "\n"
                "--pause, --resume and --rate change what every reaper of the store does, the\n"
                "ones running included (within a second), and print the settings: a paused\n"
                "reaper stops and none starts until --resume, and the rate bounds the bytes a\n"
                "reaper frees per second, and those it writes folding layers, so that it never\n"
                "floods the disk the foreground uses.\n",
        .options = (const CommandOption[]) {
                { ARG_WAIT, "wait", NULL, "if another reaper is running, wait for it, then reap" },
                { ARG_PAUSE, "pause", NULL, "stop every reaper until --resume" },
                { ARG_RESUME, "resume", NULL, "let reapers run again" },
                { ARG_RATE, "rate", "BYTES", "free at most BYTES per second (with K, M, G or T;\n"
                  "'none' for no limit)" },
                {}
        },
        .examples = (const char *const[]) {
                PROGRAM_NAME " reap",
                PROGRAM_NAME " --json reap --wait",
                PROGRAM_NAME " reap --rate 50M",
                PROGRAM_NAME " reap --pause",
                NULL,
        },
        .flags = COMMAND_JSON | COMMAND_SIZES,
        .run = verb_reap,
};

const Command command_scrub = {
        .name = "scrub",
        .synopsis = "[--raw]",
        .summary = "Verify every live block of the store against its checksum.",
        .description =
                "Prints each damaged block with every subvolume and path that uses it (a path of\n"
                "'-' means no file uses the block any more), then a summary. Reading a damaged\n"
                "block fails with EIO rather than return wrong data. On a terminal, a line on\n"
                "standard error shows how many bytes of blocks are checked, of how many. A reaper\n"
                "that runs is waited for: what it frees would look like damage.\n"
                "\n"
                "Exit status: 0 if nothing is damaged, 1 if a block is damaged or the scrub\n"
                "could not finish.\n",
        .examples = (const char *const[]) {
                PROGRAM_NAME " scrub",
                PROGRAM_NAME " --json scrub > scrub.json",
                NULL,
        },
        .flags = COMMAND_JSON | COMMAND_SIZES,
        .run = verb_scrub,
};

const Command command_fsck = {
        .name = "fsck",
        .synopsis = "[--repair]",
        .summary = "Check the catalog, every layer's metadata and the block index.",
        .description =
                "Prints each problem found, then a summary. With --repair, problems that can be\n"
                "repaired without losing data (a layer's block reference counts that disagree\n"
                "with its extents; a subvolume's next inode number that is already taken, or\n"
                "its counts of inodes and bytes, which its quota and usage are read from, that\n"
                "disagree with what its layers hold) are repaired; the others are only\n"
                "reported. Nothing may have a subvolume mounted during a repair. On a terminal, a\n"
                "line on standard error shows how many bytes of metadata are checked, of how\n"
                "many. A reaper that runs is waited for: the layers it folds and drops would look\n"
                "like a broken store.\n"
                "\n"
                "Exit status: 0 if no problem is left unrepaired, 1 if one is or the check could\n"
                "not finish.\n",
        .options = (const CommandOption[]) {
                { ARG_REPAIR, "repair", NULL, "repair what can be repaired without losing data" },
                {}
        },
        .examples = (const char *const[]) {
                PROGRAM_NAME " fsck",
                PROGRAM_NAME " fsck --repair",
                NULL,
        },
        .flags = COMMAND_JSON,
        .run = verb_fsck,
};
