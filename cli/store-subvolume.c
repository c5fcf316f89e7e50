/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * cowbox-store subvolume: create, snapshot, delete, list and show. Each verb
 * checks its arguments, opens the store, makes one library call and reports.
 */

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>

#include "store-tool.h"
#include "string-util.h"

/* Everything a subvolume reports. Tables (list) leave out the detail fields,
 * so that a row fits a terminal; show and JSON have them all. */
static const Field subvolume_fields[] = {
        FIELD("ID", "id", FIELD_U64, StoreSubvolumeInfo, id),
        FIELD("Name", "name", FIELD_STRING, StoreSubvolumeInfo, name),
        FIELD_DETAILED("UUID", "uuid", FIELD_CHARS, StoreSubvolumeInfo, uuid),
        FIELD_DETAILED("Parent UUID", "parent_uuid", FIELD_CHARS, StoreSubvolumeInfo, parent_uuid),
        FIELD_DETAILED("Received UUID", "received_uuid", FIELD_CHARS, StoreSubvolumeInfo, received_uuid),
        FIELD_DETAILED("Transaction", "ctransid", FIELD_U64, StoreSubvolumeInfo, ctransid),
        FIELD_DETAILED("Sent transaction", "stransid", FIELD_U64, StoreSubvolumeInfo, stransid),
        FIELD("Read-only", "readonly", FIELD_BOOL, StoreSubvolumeInfo, readonly),
        FIELD_DETAILED("Created", "created_usec", FIELD_TIME_USEC, StoreSubvolumeInfo, created_usec),
        FIELD_DETAILED("Top layer", "top_layer", FIELD_U64, StoreSubvolumeInfo, top_layer),
        FIELD_DETAILED("Layers", "depth", FIELD_UINT, StoreSubvolumeInfo, depth),
        FIELD("Logical", "logical_bytes", FIELD_BYTES, StoreSubvolumeInfo, logical_bytes),
        FIELD("Referenced", "referenced_bytes", FIELD_BYTES, StoreSubvolumeInfo, referenced_bytes),
        FIELD("Exclusive", "exclusive_bytes", FIELD_BYTES, StoreSubvolumeInfo, exclusive_bytes),
        FIELD_DETAILED("Inodes", "inodes", FIELD_U64, StoreSubvolumeInfo, inodes),
        FIELD_DETAILED("Quota", "quota_bytes", FIELD_LIMIT, StoreSubvolumeInfo, quota_bytes),
        FIELD("Mounted by", "mounted_by", FIELD_PID, StoreSubvolumeInfo, mounted_by),
        {}
};

/* What delete reports. */
typedef struct DeleteResult {
        const char *name;
        uint64_t id;            /* when deleted by ID */
        bool reaper_started;
} DeleteResult;

static const Field delete_fields[] = {
        FIELD("Deleted", "name", FIELD_STRING, DeleteResult, name),
        FIELD("Reaper started", "reaper_started", FIELD_BOOL, DeleteResult, reaper_started),
        {}
};

static const Field delete_id_fields[] = {
        FIELD("Deleted ID", "id", FIELD_U64, DeleteResult, id),
        FIELD("Reaper started", "reaper_started", FIELD_BOOL, DeleteResult, reaper_started),
        {}
};

static int report_name_taken(const char *name) {
        return report_failure("a subvolume named '%s' already exists; choose another name, or delete "
                              "it first with '" PROGRAM_NAME " subvolume delete %s'", name, name);
}

/* Parses a verb with no options of its own and exactly n_names subvolume names. */
/* parse_names() printed the help: the verb is done. */
#define PARSE_DONE (-1)

/* 0 to go on with the verb, PARSE_DONE, or an exit status. */
static int parse_names(Tool *tool, const Command *cmd, int argc, char *argv[], int n_names) {
        int c, r;

        c = command_getopt(tool, cmd, argc, argv);
        if (c == OPTIONS_HELP)
                return PARSE_DONE;
        if (c != 0)
                return options_exit_status(c);

        r = command_check_arguments(cmd, argc, argv, n_names, n_names);
        if (r != 0)
                return r;

        for (int i = optind; i < argc; i++) {
                r = command_check_name(cmd, argv[i]);
                if (r != 0)
                        return r;
        }
        return EXIT_SUCCESS;
}

/* With --json, create, snapshot and set-quota print the subvolume as show
 * does, so that a script learns its id and UUID without asking again. */
static int print_subvolume_json(Store *store, const char *name) {
        _cleanup_(store_subvolume_info_clear) StoreSubvolumeInfo info = {};
        int r;

        r = store_subvolume_show(store, name, &info);
        if (r < 0)
                return report_failure("subvolume '%s' was changed, but reading it back failed: %s",
                                      name, error_text(r));

        _cleanup_json_ json_t *doc = record_to_json(subvolume_fields, &info);
        return json_print(doc);
}

static int verb_create(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        _cleanup_store_ Store *store = NULL;
        const char *name;
        int r;

        r = parse_names(tool, cmd, argc, argv, 1);
        if (r != 0)
                return r == PARSE_DONE ? EXIT_SUCCESS : r;
        name = argv[optind];
        r = command_check_new_name(cmd, name);
        if (r != 0)
                return r;

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;

        r = store_subvolume_create(store, name);
        if (r == -EEXIST)
                return report_name_taken(name);
        if (r < 0)
                return report_failure("cannot create subvolume '%s': %s", name, error_text(r));

        if (tool->json)
                return print_subvolume_json(store, name);
        printf("Created subvolume '%s'.\n", name);
        return EXIT_SUCCESS;
}

/* The arguments NAME NEW_NAME of snapshot and rename, after the options:
 * a subvolume, and a name it may take. */
static int parse_name_and_new_name(const Command *cmd, int argc, char *argv[], const char **ret_name,
                                   const char **ret_new_name) {
        int r;

        r = command_check_arguments(cmd, argc, argv, 2, 2);
        if (r != 0)
                return r;
        *ret_name = argv[optind];
        *ret_new_name = argv[optind + 1];
        r = command_check_name(cmd, *ret_name);
        return r != 0 ? r : command_check_new_name(cmd, *ret_new_name);
}

static int verb_snapshot(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        _cleanup_store_ Store *store = NULL;
        const char *source, *name;
        bool readonly = false;
        int c, r;

        while ((c = command_getopt(tool, cmd, argc, argv)) > 0)
                if (c == 'r')
                        readonly = true;
        if (c < 0)
                return options_exit_status(c);

        r = parse_name_and_new_name(cmd, argc, argv, &source, &name);
        if (r != 0)
                return r;

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;

        r = store_subvolume_snapshot(store, source, name, readonly);
        if (r == -ENOENT)
                return report_no_subvolume(source);
        if (r == -EEXIST)
                return report_name_taken(name);
        if (r < 0)
                return report_failure("cannot snapshot '%s' as '%s': %s", source, name, error_text(r));

        if (tool->json)
                return print_subvolume_json(store, name);
        printf("Created %s snapshot '%s' of '%s'.\n", readonly ? "read-only" : "writable", name, source);
        return EXIT_SUCCESS;
}

/* Deletion only marks the subvolume gone; unless told not to, start the
 * reaper now, so that the space comes back without anyone asking. */
static bool start_reaper(Store *store, const char *what) {
        int r;

        r = store_reap_in_background(store);
        if (r < 0) {
                report_warning("%s is deleted, but the reaper did not start (%s), ignoring; run '"
                               PROGRAM_NAME " reap' to free its space", what, error_text(r));
                return false;
        }
        return true;
}

static void print_deleted_text(const char *what, bool reap, bool reaper_started) {
        if (reaper_started)
                printf("Deleted %s; the reaper frees its space in the background.\n", what);
        else if (!reap)
                printf("Deleted %s; its space is freed by the next '" PROGRAM_NAME " reap'.\n", what);
        else
                printf("Deleted %s.\n", what);
}

static int delete_by_id(Store *store, const char *text, DeleteResult *result, char *what, size_t size) {
        char process[PROCESS_DESCRIPTION_MAX];
        pid_t holder = 0;
        int r;

        if (parse_number(text, &result->id) < 0 || result->id == 0 || result->id > INT64_MAX)
                return report_failure("'%s' is not a subvolume ID: 'subvolume list' shows them", text);
        snprintf(what, size, "subvolume ID %" PRIu64, result->id);

        r = store_subvolume_delete_id(store, result->id, &holder);
        if (r == -ENOENT)
                return report_failure("no subvolume has ID %" PRIu64 " in this store (list them with '"
                                      PROGRAM_NAME " subvolume list')", result->id);
        if (r == -EBUSY)
                return report_failure("%s is mounted by %s; unmount it (fusermount3 -u MOUNTPOINT) or stop "
                                      "that process, then delete it", what, describe_process(holder, process));
        if (r < 0)
                return report_failure("cannot delete %s: %s", what, error_text(r));
        return EXIT_SUCCESS;
}

static int delete_by_name(Store *store, const char *name, char *what, size_t size) {
        pid_t holder = 0;
        int r;

        snprintf(what, size, "subvolume '%s'", name);
        r = store_subvolume_delete(store, name, &holder);
        if (r == -ENOENT)
                return report_no_subvolume(name);
        if (r == -EBUSY)
                return report_subvolume_busy(name, holder, "unmount it (fusermount3 -u MOUNTPOINT) or stop "
                                             "that process, then delete it");
        if (r < 0)
                return report_failure("cannot delete subvolume '%s': %s", name, error_text(r));
        return EXIT_SUCCESS;
}

static int verb_delete(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        _cleanup_store_ Store *store = NULL;
        char what[STORE_NAME_MAX + 32];
        DeleteResult result = {};
        const char *id = NULL;
        bool reap = true;
        int c, r;

        while ((c = command_getopt(tool, cmd, argc, argv)) > 0) {
                if (c == ARG_NO_REAP)
                        reap = false;
                else if (c == ARG_ID)
                        id = optarg;
        }
        if (c < 0)
                return options_exit_status(c);

        r = command_check_arguments(cmd, argc, argv, id ? 0 : 1, id ? 0 : 1);
        if (r != 0)
                return r;
        if (!id) {
                result.name = argv[optind];
                r = command_check_name(cmd, result.name);
                if (r != 0)
                        return r;
        }

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;

        r = id ? delete_by_id(store, id, &result, what, sizeof what)
               : delete_by_name(store, result.name, what, sizeof what);
        if (r != EXIT_SUCCESS)
                return r;

        if (reap)
                result.reaper_started = start_reaper(store, what);

        if (tool->json) {
                _cleanup_json_ json_t *doc = record_to_json(id ? delete_id_fields : delete_fields, &result);
                return json_print(doc);
        }
        print_deleted_text(what, reap, result.reaper_started);
        return EXIT_SUCCESS;
}

static int verb_list(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        _cleanup_(subvolume_list_done) SubvolumeList list = {};
        _cleanup_store_ Store *store = NULL;
        size_t sound;
        int r;

        r = parse_names(tool, cmd, argc, argv, 0);
        if (r != 0)
                return r == PARSE_DONE ? EXIT_SUCCESS : r;

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;

        r = store_subvolume_list(store, &list.items, &list.n);
        if (r < 0)
                return report_failure("cannot list the subvolumes of %s: %s", store_path(store), error_text(r));
        sound = subvolume_list_damaged_last(&list);

        if (tool->json) {
                _cleanup_json_ json_t *doc = json_object();
                if (!json_add(doc, "subvolumes", records_to_json(subvolume_fields, list.items,
                                                                 sizeof(StoreSubvolumeInfo), sound)) ||
                    !json_add(doc, "damaged", records_to_json(damaged_subvolume_fields, list.items + sound,
                                                              sizeof(StoreSubvolumeInfo), list.n - sound)))
                        return json_print(NULL);
                r = json_print(doc);
        } else if (list.n == 0) {
                printf("No subvolumes in %s (create one with '" PROGRAM_NAME " subvolume create NAME').\n",
                       store_path(store));
                r = EXIT_SUCCESS;
        } else {
                if (sound > 0)
                        records_print(tool, subvolume_fields, list.items, sizeof(StoreSubvolumeInfo), sound);
                r = EXIT_SUCCESS;
        }
        if (report_damaged_subvolumes(list.items + sound, list.n - sound) != EXIT_SUCCESS)
                return EXIT_FAILURE;
        return r;
}

static int verb_show(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        _cleanup_(store_subvolume_info_clear) StoreSubvolumeInfo info = {};
        _cleanup_store_ Store *store = NULL;
        const char *name;
        int r;

        r = parse_names(tool, cmd, argc, argv, 1);
        if (r != 0)
                return r == PARSE_DONE ? EXIT_SUCCESS : r;
        name = argv[optind];

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;

        r = store_subvolume_show(store, name, &info);
        if (r == -ENOENT)
                return report_no_subvolume(name);
        if (r < 0)
                return report_failure("cannot show subvolume '%s': %s", name, error_text(r));

        if (tool->json) {
                _cleanup_json_ json_t *doc = record_to_json(subvolume_fields, &info);
                return json_print(doc);
        }
        record_print(tool, subvolume_fields, &info, 0);
        return EXIT_SUCCESS;
}

static int verb_set_quota(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        _cleanup_store_ Store *store = NULL;
        const char *name, *size;
        uint64_t bytes;
        int c, r;

        c = command_getopt(tool, cmd, argc, argv);
        if (c != 0)
                return options_exit_status(c);
        r = command_check_arguments(cmd, argc, argv, 2, 2);
        if (r != 0)
                return r;
        name = argv[optind];
        size = argv[optind + 1];
        r = command_check_name(cmd, name);
        if (r != 0)
                return r;
        r = parse_size(size, &bytes);
        if (r == -ERANGE || (r >= 0 && bytes > (uint64_t) INT64_MAX))
                return report_usage_error(cmd, "'%s' is too large a quota: at most %" PRIi64 " bytes", size,
                                          INT64_MAX);
        if (r < 0)
                return report_usage_error(cmd, "'%s' is not a size: give bytes, optionally with K, M, G or T "
                                          "(powers of 1024), or 'none'", size);

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;
        r = store_subvolume_set_quota(store, name, bytes);
        if (r == -ENOENT)
                return report_no_subvolume(name);
        if (r < 0)
                return report_failure("cannot set the quota of subvolume '%s': %s", name, error_text(r));

        if (tool->json)
                return print_subvolume_json(store, name);
        if (bytes == 0)
                printf("Subvolume '%s' has no quota.\n", name);
        else {
                char buf[FORMAT_BYTES_MAX];
                printf("Subvolume '%s' may hold %s (%" PRIu64 " bytes).\n", name, format_bytes(bytes, buf), bytes);
        }
        return EXIT_SUCCESS;
}

static int verb_rename(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        _cleanup_store_ Store *store = NULL;
        const char *name, *new_name;
        int c, r;

        c = command_getopt(tool, cmd, argc, argv);
        if (c != 0)
                return options_exit_status(c);
        r = parse_name_and_new_name(cmd, argc, argv, &name, &new_name);
        if (r != 0)
                return r;

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;
        r = store_subvolume_rename(store, name, new_name);
        if (r == -ENOENT)
                return report_no_subvolume(name);
        if (r == -EEXIST)
                return report_name_taken(new_name);
        if (r < 0)
                return report_failure("cannot rename subvolume '%s' to '%s': %s", name, new_name, error_text(r));

        if (tool->json)
                return print_subvolume_json(store, new_name);
        printf("Renamed subvolume '%s' to '%s'.\n", name, new_name);
        return EXIT_SUCCESS;
}

static int verb_set_readonly(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        _cleanup_store_ Store *store = NULL;
        const char *name;
        int readonly, c, r;

        c = command_getopt(tool, cmd, argc, argv);
        if (c != 0)
                return options_exit_status(c);
        r = command_check_arguments(cmd, argc, argv, 2, 2);
        if (r != 0)
                return r;
        name = argv[optind];
        r = command_check_name(cmd, name);
        if (r != 0)
                return r;
        readonly = parse_boolean(argv[optind + 1]);
        if (readonly < 0)
                return report_usage_error(cmd, "'%s' is neither true nor false", argv[optind + 1]);

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;
        r = store_subvolume_set_readonly(store, name, readonly);
        if (r == -ENOENT)
                return report_no_subvolume(name);
        if (r == -EBUSY) {
                StoreSubvolumeInfo info = {};
                pid_t holder = store_subvolume_show(store, name, &info) >= 0 ? info.mounted_by : 0;

                store_subvolume_info_clear(&info);
                return report_subvolume_busy(name, holder, "unmount it (fusermount3 -u MOUNTPOINT) first");
        }
        if (r < 0)
                return report_failure("cannot make subvolume '%s' %s: %s", name,
                                      readonly ? "read-only" : "writable", error_text(r));

        if (tool->json)
                return print_subvolume_json(store, name);
        printf("Subvolume '%s' is %s.\n", name, readonly ? "read-only" : "writable");
        return EXIT_SUCCESS;
}

static const Command subvolume_create = {
        .name = "subvolume create",
        .synopsis = "NAME",
        .summary = "Create an empty, writable subvolume.",
        .description =
                "NAME is 1 to 255 bytes, without '/' or control characters, and not '.' or '..'.\n"
                "With --json, prints the new subvolume as 'subvolume show' does.\n",
        .examples = (const char *const[]) {
                PROGRAM_NAME " subvolume create base",
                NULL,
        },
        .flags = COMMAND_JSON,
        .run = verb_create,
};

static const Command subvolume_snapshot = {
        .name = "subvolume snapshot",
        .synopsis = "[-r|--readonly] SOURCE NAME",
        .summary = "Snapshot subvolume SOURCE as NAME, in constant time whatever its size.",
        .description =
                "The snapshot shares all of SOURCE's data; from then on each changes on its own,\n"
                "and only what changes takes new space. SOURCE may be mounted writable: the\n"
                "process serving it takes the snapshot at a consistent point. Read-only snapshots\n"
                "suit images and backups; writable ones suit sandboxes and workspaces.\n"
                "With --json, prints the new subvolume as 'subvolume show' does.\n",
        .options = (const CommandOption[]) {
                { 'r', "readonly", NULL, "make the snapshot read-only (default: writable)" },
                {}
        },
        .examples = (const char *const[]) {
                PROGRAM_NAME " subvolume snapshot --readonly base base-v1",
                PROGRAM_NAME " subvolume snapshot base-v1 build-1234",
                NULL,
        },
        .flags = COMMAND_JSON,
        .run = verb_snapshot,
};

static const Command subvolume_delete = {
        .name = "subvolume delete",
        .synopsis = "[--no-reap] {NAME | --id ID}",
        .summary = "Delete a subvolume, at once; its space is freed in the background.",
        .description =
                "Deletion marks the subvolume deleted in one transaction and returns. The reaper\n"
                "then frees the space that only this subvolume used: it is started in the\n"
                "background unless --no-reap is given (see '" PROGRAM_NAME " reap'). Snapshots\n"
                "of the subvolume are not affected. A subvolume mounted writable cannot be\n"
                "deleted: unmount it first with 'fusermount3 -u MOUNTPOINT'.\n"
                "\n"
                "A subvolume whose record in the catalog is damaged (see 'subvolume list' and\n"
                "'" PROGRAM_NAME " scrub') cannot be used, and the reaper frees nothing while\n"
                "it is there: deleting it removes the record at once. When the damage has made\n"
                "its name unusable, --id deletes it by its ID.\n",
        .options = (const CommandOption[]) {
                { ARG_NO_REAP, "no-reap", NULL, "do not start the reaper: the space stays in use\n"
                  "until '" PROGRAM_NAME " reap' runs" },
                { ARG_ID, "id", "ID", "the subvolume of this ID, as 'subvolume list' shows\n"
                  "it, rather than one named" },
                {}
        },
        .examples = (const char *const[]) {
                PROGRAM_NAME " subvolume delete build-1234",
                PROGRAM_NAME " subvolume delete --no-reap build-1234 && " PROGRAM_NAME " reap --wait",
                PROGRAM_NAME " subvolume delete --id 17",
                NULL,
        },
        .flags = COMMAND_JSON,
        .run = verb_delete,
};

static const Command subvolume_list = {
        .name = "subvolume list",
        .synopsis = "[--raw]",
        .summary = "List the subvolumes of the store.",
        .description =
                "For each subvolume: its id, name, whether it is read-only, its space, and the\n"
                "process that has it mounted writable, if any. Logical is what its files hold;\n"
                "referenced is what its layers store on disk after compression and deduplication;\n"
                "exclusive is what deleting it would free. With --json, every field of\n"
                "'subvolume show' is given for each subvolume, sizes in bytes.\n"
                "\n"
                "A subvolume whose record in the catalog, or that of a layer it stands on, is\n"
                "damaged is left out of the table and named on standard error (in the JSON, in\n"
                "\"damaged\", with its id), and the exit status is 1: 'scrub' tells more, and\n"
                "deleting the subvolume (by name, or with 'subvolume delete --id ID') mends the\n"
                "store.\n",
        .examples = (const char *const[]) {
                PROGRAM_NAME " subvolume list",
                PROGRAM_NAME " --json subvolume list",
                NULL,
        },
        .flags = COMMAND_JSON | COMMAND_SIZES,
        .run = verb_list,
};

static const Command subvolume_show = {
        .name = "subvolume show",
        .synopsis = "[--raw] NAME",
        .summary = "Show everything known about a subvolume.",
        .description =
                "Its id, name, UUID and the UUID of the subvolume it is a snapshot of, whether it\n"
                "is read-only, when it was created, its stack of layers (top layer and depth),\n"
                "its space (see 'subvolume list'), its number of inodes, and the process that has\n"
                "it mounted writable, if any.\n",
        .examples = (const char *const[]) {
                PROGRAM_NAME " subvolume show base",
                PROGRAM_NAME " --json subvolume show base",
                NULL,
        },
        .flags = COMMAND_JSON | COMMAND_SIZES,
        .run = verb_show,
};

static const Command subvolume_set_quota = {
        .name = "subvolume set-quota",
        .synopsis = "NAME SIZE",
        .summary = "Limit how many bytes the files of a subvolume may hold.",
        .description =
                "SIZE counts the subvolume's logical bytes (the sum of its files' sizes), in\n"
                "bytes or with K, M, G or T (powers of 1024); 'none' or 0 removes the limit. A\n"
                "write that would pass the limit fails with EDQUOT ('Disk quota exceeded'), and\n"
                "nothing written before is lost. Snapshots keep the limit of their source. A\n"
                "server that has the subvolume mounted applies a new limit within a few seconds.\n",
        .examples = (const char *const[]) {
                PROGRAM_NAME " subvolume set-quota workspace 20G",
                PROGRAM_NAME " subvolume set-quota workspace none",
                NULL,
        },
        .flags = COMMAND_JSON | COMMAND_SIZES,
        .run = verb_set_quota,
};

static const Command subvolume_rename = {
        .name = "subvolume rename",
        .synopsis = "NAME NEW_NAME",
        .summary = "Give a subvolume another name.",
        .description =
                "The subvolume keeps its ID, its UUID and its files; only its name changes, in\n"
                "one transaction. It may be mounted meanwhile: its mount goes on. NEW_NAME must\n"
                "not be taken.\n",
        .examples = (const char *const[]) {
                PROGRAM_NAME " subvolume rename base-next base",
                NULL,
        },
        .flags = COMMAND_JSON,
        .run = verb_rename,
};

static const Command subvolume_set_readonly = {
        .name = "subvolume set-readonly",
        .synopsis = "NAME true|false",
        .summary = "Make a subvolume read-only, or writable again.",
        .description =
                "A read-only subvolume's files cannot change, whoever mounts it, and it can be\n"
                "sent ('" PROGRAM_NAME " send'). Making it read-only freezes its top layer, in\n"
                "constant time. Making it writable again gives it a new empty top layer, and\n"
                "forgets the send stream it was received from, as btrfs does: an increment sent\n"
                "against that stream no longer applies to it. A mounted subvolume cannot be\n"
                "changed either way: unmount it first.\n",
        .examples = (const char *const[]) {
                PROGRAM_NAME " subvolume set-readonly base true",
                PROGRAM_NAME " subvolume set-readonly scratch false",
                NULL,
        },
        .flags = COMMAND_JSON,
        .run = verb_set_readonly,
};

static const Command *const subvolume_verbs[] = {
        &subvolume_create,
        &subvolume_snapshot,
        &subvolume_delete,
        &subvolume_rename,
        &subvolume_list,
        &subvolume_show,
        &subvolume_set_quota,
        &subvolume_set_readonly,
        NULL,
};

const Command command_subvolume = {
        .name = "subvolume",
        .synopsis = "COMMAND [ARGS...]",
        .summary = "Create, snapshot, delete, rename, list and show subvolumes, limit their size.",
        .description =
                "A subvolume is a tree of files, stored as a stack of layers. Snapshots and\n"
                "deletion cost the same whatever the tree's size; to use a subvolume's files,\n"
                "mount it (see '" PROGRAM_NAME " mount --help').\n",
        .examples = (const char *const[]) {
                PROGRAM_NAME " subvolume create base",
                PROGRAM_NAME " subvolume snapshot -r base base-v1",
                PROGRAM_NAME " subvolume list",
                PROGRAM_NAME " subvolume delete base-v1",
                NULL,
        },
        .flags = COMMAND_JSON,
        .verbs = subvolume_verbs,
};
