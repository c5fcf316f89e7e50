/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * store-tool.h: what the files of cowbox-store share, and nothing else: the
 * command table, option parsing, the field tables through which every result
 * is printed as text or JSON, and error reporting. Only cli/store-*.c include
 * it.
 */

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cleanup.h"
#include "store.h"

#define PROGRAM_NAME "cowbox-store"

/* Exit statuses: EXIT_SUCCESS, EXIT_FAILURE (the work failed, or scrub and
 * fsck found something), and EXIT_USAGE (the command line was wrong). */
#define EXIT_USAGE 2

/* jansson (>= 2.11) already defines json_decrefp() for GCC; name it the way
 * the rest of cowbox names its cleanups. */
#define _cleanup_json_ _cleanup_(json_decrefp)

DEFINE_TRIVIAL_CLEANUP_FUNC(Store *, store_close);
#define _cleanup_store_ _cleanup_(store_closep)

/* What store_subvolume_list() returns, freed as one. */
typedef struct SubvolumeList {
        StoreSubvolumeInfo *items;
        size_t n;
} SubvolumeList;

static inline void subvolume_list_done(SubvolumeList *l) {
        store_subvolume_info_array_free(l->items, l->n);
}

/* Moves the damaged subvolumes of a listing behind the others, each group
 * in its order, and returns how many are sound. */
size_t subvolume_list_damaged_last(SubvolumeList *l);

/* Names each of the damaged subvolumes on standard error, and what to do;
 * EXIT_FAILURE if there is one, EXIT_SUCCESS otherwise. */
int report_damaged_subvolumes(const StoreSubvolumeInfo *damaged, size_t n);

/* What the global options chose, and the output options of the command. */
typedef struct Tool {
        const char *store_path;
        bool json;
        bool raw;               /* exact byte counts instead of human sizes */
} Tool;

/* Option ids above any short option letter, for options with a long name only. */
enum {
        ARG_JSON = 0x100,
        ARG_RAW,
        ARG_STORE,
        ARG_VERSION,
        ARG_NO_REAP,
        ARG_ID,
        ARG_WAIT,
        ARG_REPAIR,
        ARG_BACKGROUND,
        ARG_READ_ONLY,
        ARG_DEBUG,
        ARG_PAUSE,
        ARG_RESUME,
        ARG_RATE,
        ARG_PROTO,
        ARG_COMPRESSED_DATA,
        ARG_ZSTD,
        ARG_WORKDIR,
        ARG_KEEP,
        ARG_TIMEOUT,
        ARG_MEMORY_MAX,
        ARG_DISK_MAX,
        ARG_PIDS_MAX,
        ARG_CPU,
        ARG_IO_READ_BPS,
        ARG_IO_WRITE_BPS,
        ARG_IO_READ_IOPS,
        ARG_IO_WRITE_IOPS,
        ARG_IO_WEIGHT,
        ARG_IO_LATENCY,
        ARG_NAME,
        ARG_HOSTNAME,
        ARG_HOST_NETWORK,
        ARG_USER,
        ARG_CWD,
        ARG_STDOUT,
        ARG_STDERR,
        ARG_ALLOW_SYSCALL,
        ARG_KEEP_CAP,
        ARG_KILL_ON_REFUSAL,
        ARG_USERNS,
};

/* An option of one command: its id (a short letter, or an ARG_* value for a
 * long-only option), its long name, the name of its value (NULL for a flag)
 * and one line of help. Tables end with an entry whose name is NULL. */
typedef struct CommandOption {
        int id;
        const char *name;
        const char *value;
        const char *help;
} CommandOption;

/* Command flags: the outputs a command declares. --json and --raw are only
 * accepted, and only documented, where declared. */
enum {
        COMMAND_JSON  = 1 << 0, /* prints a result, as text or as JSON */
        COMMAND_SIZES = 1 << 1, /* prints sizes: takes --raw */
        COMMAND_OPTIONS_FIRST = 1 << 2, /* options only before the first argument */
        COMMAND_REPORT_ON_STDERR = 1 << 3, /* its result goes to standard error (stdout is a task's) */
};

typedef struct Command Command;
typedef int (*command_run_t)(Tool *tool, const Command *cmd, int argc, char *argv[]);

/* One verb, or a noun with verbs of its own ("subvolume"). A verb's handler
 * gets argv[0] = the verb and returns an exit status; it reports its own
 * errors, since only it knows what the user should do about them. */
struct Command {
        const char *name;               /* full path: "subvolume snapshot" */
        const char *synopsis;           /* the arguments after the name */
        const char *summary;            /* one line, as a sentence */
        const char *description;        /* lines of detail, or NULL */
        const CommandOption *options;   /* the command's own options, or NULL */
        const char *const *examples;    /* NULL-terminated, or NULL */
        unsigned flags;
        command_run_t run;              /* for a verb */
        const Command *const *verbs;    /* for a noun: NULL-terminated */
};

/* The commands of each file. */
extern const Command command_init;
extern const Command command_subvolume;
extern const Command command_mount;
extern const Command command_usage;
extern const Command command_reap;
extern const Command command_scrub;
extern const Command command_fsck;
extern const Command command_receive;
extern const Command command_send;
extern const Command command_run;

/* Option parsing for a verb's handler: returns the id of one of the
 * command's own options, 0 when the options are done (the arguments are then
 * argv[optind..argc-1]), or a negative OPTIONS_* value when the handler
 * should return options_exit_status(). --help, --json and --raw are handled
 * here. */
enum {
        OPTIONS_HELP = -1,      /* help was printed */
        OPTIONS_INVALID = -2,   /* a usage error was reported */
};
int command_getopt(Tool *tool, const Command *cmd, int argc, char *argv[]);
int options_exit_status(int c);

/* Checks that there are between min and max arguments after the options;
 * returns 0 or reports a usage error and returns EXIT_USAGE. */
int command_check_arguments(const Command *cmd, int argc, char *argv[], int min, int max);

/* Checks a subvolume name given on the command line: 0 or EXIT_USAGE. */
int command_check_name(const Command *cmd, const char *name);
/* The same, for the name of a subvolume to make: not one of those that a
 * receive uses while it works, which the next receive deletes. */
int command_check_new_name(const Command *cmd, const char *name);

void command_help(const Command *cmd);

/* Error reporting. Each prints "cowbox-store: <sentence>" on stderr and
 * returns the exit status to return. */
int report_failure(const char *format, ...) _printf_(1, 2);
int report_usage_error(const Command *cmd, const char *format, ...) _printf_(2, 3);
int report_no_subvolume(const char *name);

/* -EBUSY from a store call that named the process holding the subvolume;
 * hint says what to do about it. */
int report_subvolume_busy(const char *name, pid_t holder, const char *hint);

/* "cowbox-store: <sentence>" for what goes wrong without failing the command. */
void report_warning(const char *format, ...) _printf_(1, 2);

/* A description of a store error code: store_strerror() if it has one, else strerror(). */
const char *error_text(int error);

/* "process 1234 (cowbox-store)", or "another process" if pid is 0. */
#define PROCESS_DESCRIPTION_MAX 64
const char *describe_process(pid_t pid, char buf[static PROCESS_DESCRIPTION_MAX]);

/* Opens the store the global options chose: EXIT_SUCCESS or (reported) EXIT_FAILURE. */
int tool_open_store(const Tool *tool, Store **ret);

/* A decimal number without sign or unit. */
int parse_number(const char *text, uint64_t *ret);
/* SIZE: bytes with an optional binary unit (K, M, G, T, with or without
 * "iB"), or "none" or 0 for no limit. -EINVAL or -ERANGE otherwise. */
int parse_size(const char *text, uint64_t *ret);

/* Human sizes: "512 B", "1.2 MiB". */
#define FORMAT_BYTES_MAX 32
const char *format_bytes(uint64_t bytes, char buf[static FORMAT_BYTES_MAX]);

/* A progress line of long work on standard error, rewritten in place
 * ("WHAT: 1.2 GiB of 4.0 GiB (30%)"; without a total, what is done), only
 * when it is a terminal: progress_wanted(). progress_clear() removes it,
 * before other output and at the end. */
bool progress_wanted(void);
void progress_show(const char *what, uint64_t done, uint64_t total);
void progress_clear(void);

/* Output. Every record kind has one table of fields, each with a text label,
 * a JSON key, a type and where it is in the record's struct, so that text
 * and JSON come from one description. JSON numbers carry no units. */
typedef enum FieldType {
        FIELD_STRING,           /* const char * member; NULL or "" shows "-", null */
        FIELD_CHARS,            /* char array member; "" shows "-", null */
        FIELD_U64,
        FIELD_UINT,             /* unsigned */
        FIELD_BYTES,            /* uint64_t: a human size, exact with --raw */
        FIELD_LIMIT,            /* uint64_t: as FIELD_BYTES, but 0 shows "none" */
        FIELD_BOOL,
        FIELD_TIME_USEC,        /* uint64_t, CLOCK_REALTIME: local time in text */
        FIELD_PID,              /* pid_t: "1234 (comm)"; 0 shows "-", null */
        FIELD_RATIO,            /* double: "3.07x"; NaN shows "-", null */
} FieldType;

enum {
        FIELD_DETAIL = 1 << 0,  /* left out of text tables, which must fit a terminal */
};

typedef struct Field {
        const char *label;
        const char *key;
        FieldType type;
        size_t offset;
        unsigned flags;
} Field;

/* A field table ends with an entry whose key is NULL. */
#define FIELD(label, key, type, record, member) { label, key, type, offsetof(record, member), 0 }
#define FIELD_DETAILED(label, key, type, record, member) \
        { label, key, type, offsetof(record, member), FIELD_DETAIL }

json_t *record_to_json(const Field *fields, const void *record);
json_t *records_to_json(const Field *fields, const void *records, size_t record_size, size_t n);

/* id and name: what a damaged subvolume's listing can say of it. */
extern const Field damaged_subvolume_fields[];

/* Text: a record as aligned "Label: value" lines, records as a table with a header. */
void record_print(const Tool *tool, const Field *fields, const void *record, unsigned indent);
void records_print(const Tool *tool, const Field *fields, const void *records, size_t record_size, size_t n);

/* Prints one JSON document on stdout; returns an exit status. A NULL doc
 * means building it ran out of memory. */
int json_print(const json_t *doc);

/* A JSON string of s; bytes that are not UTF-8 become '?', since names may hold any. */
json_t *json_string_lossy(const char *s);

/* Adds value to object under key, taking value over; false when out of memory. */
bool json_add(json_t *object, const char *key, json_t *value);
