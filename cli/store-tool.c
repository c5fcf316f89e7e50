/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * cowbox-store: offline administration of a cowbox store, as btrfs-progs is
 * for btrfs. This file holds main, the global options, the command table and
 * its dispatch, help, and the output and error helpers the other files share.
 * The work itself is all in the store library (store/store.h).
 */

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "images.h"
#include "store-tool.h"
#include "string-util.h"

#define COMMAND_OPTIONS_MAX 32
#define TABLE_COLUMNS_MAX 32
#define CELL_MAX 64

static bool isempty(const char *s) {
        return !s || !*s;
}

/* ---- errors ---- */

_printf_(1, 0)
static void report_va(const char *format, va_list ap, const char *hint_command) {
        fputs(PROGRAM_NAME ": ", stderr);
        vfprintf(stderr, format, ap);
        if (hint_command)
                fprintf(stderr, "; see '" PROGRAM_NAME "%s%s --help'",
                        *hint_command ? " " : "", hint_command);
        fputc('\n', stderr);
}

int report_failure(const char *format, ...) {
        va_list ap;

        va_start(ap, format);
        report_va(format, ap, NULL);
        va_end(ap);
        return EXIT_FAILURE;
}

static bool string_is_printable(const char *s) {
        for (; *s; s++)
                if (iscntrl((unsigned char) *s))
                        return false;
        return true;
}

size_t subvolume_list_damaged_last(SubvolumeList *l) {
        size_t sound = 0;

        for (size_t i = 0; i < l->n; i++) {
                StoreSubvolumeInfo info = l->items[i];

                if (info.damaged)
                        continue;
                memmove(&l->items[sound + 1], &l->items[sound], (i - sound) * sizeof info);
                l->items[sound++] = info;
        }
        return sound;
}

int report_damaged_subvolumes(const StoreSubvolumeInfo *damaged, size_t n) {
        /* A damaged record's name may hold anything: not sent to a
         * terminal as it is. */
        for (size_t i = 0; i < n; i++)
                report_failure("subvolume %s%s%s (ID %" PRIu64 ") is left out: the catalog's record of it, or "
                               "of a layer it stands on, is damaged. '" PROGRAM_NAME " scrub' names the "
                               "damage; deleting the subvolume ('" PROGRAM_NAME " subvolume delete --id %"
                               PRIu64 "') mends the store",
                               string_is_printable(damaged[i].name) ? "'" : "",
                               string_is_printable(damaged[i].name) ? damaged[i].name : "of an unprintable name",
                               string_is_printable(damaged[i].name) ? "'" : "", damaged[i].id, damaged[i].id);
        return n > 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

const Field damaged_subvolume_fields[] = {
        FIELD("ID", "id", FIELD_U64, StoreSubvolumeInfo, id),
        FIELD("Name", "name", FIELD_STRING, StoreSubvolumeInfo, name),
        {}
};

int report_usage_error(const Command *cmd, const char *format, ...) {
        va_list ap;

        va_start(ap, format);
        report_va(format, ap, cmd ? cmd->name : "");
        va_end(ap);
        return EXIT_USAGE;
}

int report_no_subvolume(const char *name) {
        return report_failure("no subvolume named '%s' in this store (list them with '"
                              PROGRAM_NAME " subvolume list')", name);
}

int report_subvolume_busy(const char *name, pid_t holder, const char *hint) {
        char process[PROCESS_DESCRIPTION_MAX];

        return report_failure("subvolume '%s' is mounted by %s; %s", name,
                              describe_process(holder, process), hint);
}

void report_warning(const char *format, ...) {
        va_list ap;

        va_start(ap, format);
        report_va(format, ap, NULL);
        va_end(ap);
}

const char *error_text(int error) {
        const char *text = store_strerror(error);

        return text ? text : strerror(-error);
}

static int read_process_comm(pid_t pid, char *buf, size_t size) {
        char path[sizeof("/proc//comm") + 3 * sizeof(pid_t)];

        snprintf(path, sizeof(path), "/proc/%d/comm", (int) pid);
        _cleanup_fclose_ FILE *f = fopen(path, "re");
        if (!f)
                return negative_errno();
        if (!fgets(buf, (int) size, f))
                return -EIO;
        buf[strcspn(buf, "\n")] = '\0';
        return 0;
}

/* "1234 (cowbox-store)", or just "1234" when the process is gone or hidden. */
static const char *format_pid(pid_t pid, char buf[static PROCESS_DESCRIPTION_MAX]) {
        char comm[32];

        if (read_process_comm(pid, comm, sizeof(comm)) < 0)
                snprintf(buf, PROCESS_DESCRIPTION_MAX, "%d", (int) pid);
        else
                snprintf(buf, PROCESS_DESCRIPTION_MAX, "%d (%s)", (int) pid, comm);
        return buf;
}

const char *describe_process(pid_t pid, char buf[static PROCESS_DESCRIPTION_MAX]) {
        char id[PROCESS_DESCRIPTION_MAX];

        if (pid <= 0)
                return "another process";
        snprintf(buf, PROCESS_DESCRIPTION_MAX, "process %s", format_pid(pid, id));
        return buf;
}

int tool_open_store(const Tool *tool, Store **ret) {
        const char *path = tool->store_path;
        int r;

        r = store_open(path, ret);
        if (r >= 0)
                return EXIT_SUCCESS;

        switch (r) {
        case -ENOENT:
                return report_failure("no store at %s (create one with '" PROGRAM_NAME
                                      " --store %s init')", path, path);
        case -ENOTDIR:
                return report_failure("%s is not a directory; name the store's directory "
                                      "with --store or $COWBOX_STORE", path);
        case -EACCES:
        case -EPERM:
                return report_failure("no permission to open the store at %s; run as a user "
                                      "who may write it (usually root)", path);
        case -EROFS:
                /* Even reading takes the catalog's journal, written beside it. */
                return report_failure("cannot open the store at %s: it is on a read-only file system, and "
                                      "even reading it needs to write its catalog's journal", path);
        default:
                return report_failure("cannot open the store at %s: %s", path, error_text(r));
        }
}

/* ---- sizes and fields ---- */

const char *format_bytes(uint64_t bytes, char buf[static FORMAT_BYTES_MAX]) {
        static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
        double value = (double) bytes;
        size_t unit = 0;

        if (bytes < 1024) {
                snprintf(buf, FORMAT_BYTES_MAX, "%" PRIu64 " B", bytes);
                return buf;
        }

        /* Move up a unit before one decimal would round to "1024.0". */
        while (value >= 1023.95 && unit + 1 < ELEMENTSOF(units)) {
                value /= 1024;
                unit++;
        }
        snprintf(buf, FORMAT_BYTES_MAX, "%.1f %s", value, units[unit]);
        return buf;
}

bool progress_wanted(void) {
        return isatty(STDERR_FILENO);
}

void progress_show(const char *what, uint64_t done, uint64_t total) {
        char done_text[FORMAT_BYTES_MAX], total_text[FORMAT_BYTES_MAX];

        format_bytes(done, done_text);
        if (total > 0)
                fprintf(stderr, "\r%s: %s of %s (%" PRIu64 "%%)\033[K", what, done_text,
                        format_bytes(total, total_text), MIN(done * 100 / total, (uint64_t) 100));
        else
                fprintf(stderr, "\r%s: %s\033[K", what, done_text);
        fflush(stderr);
}

void progress_clear(void) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
}

static const char *format_time_usec(uint64_t usec, char *buf, size_t size) {
        time_t t = (time_t) (usec / 1000000);
        struct tm tm;

        if (usec == 0)
                return "-";
        if (!localtime_r(&t, &tm) || strftime(buf, size, "%Y-%m-%d %H:%M:%S", &tm) == 0)
                snprintf(buf, size, "@%" PRIu64, usec / 1000000);
        return buf;
}

static const void *field_pointer(const Field *f, const void *record) {
        return (const char *) record + f->offset;
}

/* The text of one field; points into buf (CELL_MAX bytes) or into the record. */
static const char *field_text(const Tool *tool, const Field *f, const void *record, char *buf) {
        const void *p = field_pointer(f, record);

        switch (f->type) {
        case FIELD_STRING: {
                const char *s = *(const char *const *) p;
                return isempty(s) ? "-" : s;
        }
        case FIELD_CHARS:
                return isempty(p) ? "-" : p;
        case FIELD_U64:
                snprintf(buf, CELL_MAX, "%" PRIu64, *(const uint64_t *) p);
                return buf;
        case FIELD_UINT:
                snprintf(buf, CELL_MAX, "%u", *(const unsigned *) p);
                return buf;
        case FIELD_LIMIT:
                if (*(const uint64_t *) p == 0)
                        return "none";
                _fallthrough_;
        case FIELD_BYTES:
                if (tool->raw) {
                        snprintf(buf, CELL_MAX, "%" PRIu64, *(const uint64_t *) p);
                        return buf;
                }
                return format_bytes(*(const uint64_t *) p, buf);
        case FIELD_BOOL:
                return *(const bool *) p ? "yes" : "no";
        case FIELD_TIME_USEC:
                return format_time_usec(*(const uint64_t *) p, buf, CELL_MAX);
        case FIELD_PID:
                return *(const pid_t *) p > 0 ? format_pid(*(const pid_t *) p, buf) : "-";
        case FIELD_RATIO:
                if (isnan(*(const double *) p))
                        return "-";
                snprintf(buf, CELL_MAX, "%.2fx", *(const double *) p);
                return buf;
        }
        return "?";
}

/* Numbers are right-aligned in tables, so that their digits line up. */
static bool field_is_number(const Field *f) {
        return f->type == FIELD_U64 || f->type == FIELD_UINT ||
                f->type == FIELD_BYTES || f->type == FIELD_RATIO;
}

/* Names may hold any byte but '/' and control characters, and JSON strings
 * must be UTF-8: show what is not as '?' rather than fail the whole document. */
json_t *json_string_lossy(const char *s) {
        json_t *j = json_string(s);
        if (j)
                return j;

        _cleanup_free_ char *copy = strdup(s);
        if (!copy)
                return NULL;
        for (char *c = copy; *c; c++)
                if ((unsigned char) *c >= 0x80)
                        *c = '?';
        return json_string(copy);
}

static json_t *field_to_json(const Field *f, const void *record) {
        const void *p = field_pointer(f, record);

        switch (f->type) {
        case FIELD_STRING: {
                const char *s = *(const char *const *) p;
                return isempty(s) ? json_null() : json_string_lossy(s);
        }
        case FIELD_CHARS:
                return isempty(p) ? json_null() : json_string_lossy(p);
        case FIELD_U64:
        case FIELD_BYTES:
        case FIELD_LIMIT:
        case FIELD_TIME_USEC:
                return json_integer((json_int_t) *(const uint64_t *) p);
        case FIELD_UINT:
                return json_integer((json_int_t) *(const unsigned *) p);
        case FIELD_BOOL:
                return json_boolean(*(const bool *) p);
        case FIELD_PID:
                return *(const pid_t *) p > 0 ? json_integer(*(const pid_t *) p) : json_null();
        case FIELD_RATIO:
                return isnan(*(const double *) p) ? json_null() : json_real(*(const double *) p);
        }
        return json_null();
}

bool json_add(json_t *object, const char *key, json_t *value) {
        /* json_object_set_new() drops value on failure, and fails on a NULL object or value. */
        return json_object_set_new(object, key, value) == 0;
}

json_t *record_to_json(const Field *fields, const void *record) {
        _cleanup_json_ json_t *object = json_object();

        for (const Field *f = fields; f->key; f++)
                if (!json_add(object, f->key, field_to_json(f, record)))
                        return NULL;
        return TAKE_PTR(object);
}

json_t *records_to_json(const Field *fields, const void *records, size_t record_size, size_t n) {
        _cleanup_json_ json_t *array = json_array();

        for (size_t i = 0; i < n; i++)
                if (json_array_append_new(array,
                                          record_to_json(fields, (const char *) records + i * record_size)) < 0)
                        return NULL;
        return TAKE_PTR(array);
}

int json_print(const json_t *doc) {
        if (!doc)
                return report_failure("out of memory while building the JSON output");

        _cleanup_free_ char *text = json_dumps(doc, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(4));
        if (!text)
                return report_failure("out of memory while writing the JSON output");
        puts(text);
        return EXIT_SUCCESS;
}

void record_print(const Tool *tool, const Field *fields, const void *record, unsigned indent) {
        size_t width = 0;

        for (const Field *f = fields; f->key; f++)
                width = MAX(width, strlen(f->label));

        for (const Field *f = fields; f->key; f++) {
                char buf[CELL_MAX];

                printf("%*s%s:%*s %s\n", (int) indent, "", f->label,
                       (int) (width - strlen(f->label)), "", field_text(tool, f, record, buf));
        }
}

static void print_upper(const char *s) {
        for (; *s; s++)
                putchar(toupper((unsigned char) *s));
}

static void print_cell(const char *text, size_t width, bool right_aligned, bool last) {
        if (right_aligned)
                printf("%*s", (int) width, text);
        else if (last)
                fputs(text, stdout);    /* no trailing blanks */
        else
                printf("%-*s", (int) width, text);
}

void records_print(const Tool *tool, const Field *fields, const void *records, size_t record_size, size_t n) {
        const Field *columns[TABLE_COLUMNS_MAX];
        size_t widths[TABLE_COLUMNS_MAX], n_columns = 0;

        for (const Field *f = fields; f->key && n_columns < TABLE_COLUMNS_MAX; f++)
                if (!(f->flags & FIELD_DETAIL)) {
                        widths[n_columns] = strlen(f->label);
                        columns[n_columns++] = f;
                }

        /* Two passes, formatting each cell twice, rather than keeping them all. */
        for (size_t i = 0; i < n; i++)
                for (size_t c = 0; c < n_columns; c++) {
                        char buf[CELL_MAX];
                        const char *text = field_text(tool, columns[c],
                                                      (const char *) records + i * record_size, buf);
                        widths[c] = MAX(widths[c], strlen(text));
                }

        for (size_t c = 0; c < n_columns; c++) {
                if (c > 0)
                        fputs("  ", stdout);
                if (field_is_number(columns[c]))
                        printf("%*s", (int) (widths[c] - strlen(columns[c]->label)), "");
                print_upper(columns[c]->label);
                if (!field_is_number(columns[c]) && c + 1 < n_columns)
                        printf("%*s", (int) (widths[c] - strlen(columns[c]->label)), "");
        }
        putchar('\n');

        for (size_t i = 0; i < n; i++) {
                for (size_t c = 0; c < n_columns; c++) {
                        char buf[CELL_MAX];

                        if (c > 0)
                                fputs("  ", stdout);
                        print_cell(field_text(tool, columns[c], (const char *) records + i * record_size, buf),
                                   widths[c], field_is_number(columns[c]), c + 1 == n_columns);
                }
                putchar('\n');
        }
}

/* ---- options ---- */

/* The option as the user wrote it, for a message about it. */
static const char *option_as_written(int argc, char *argv[], char buf[static 8]) {
        const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "";

        if (optopt > 0 && optopt < 0x100 && strncmp(arg, "--", 2) != 0) {
                snprintf(buf, 8, "-%c", optopt);
                return buf;
        }
        return arg;
}

static int report_option_error(const Command *cmd, int c, int argc, char *argv[]) {
        char buf[8];
        const char *option = option_as_written(argc, argv, buf);

        if (c == ':')
                return report_usage_error(cmd, "option '%s' needs a value", option);
        if (cmd)
                return report_usage_error(cmd, "'%s' has no option '%s'", cmd->name, option);
        return report_usage_error(cmd, "unknown option '%s'; the options before the command are "
                                  "--store=DIR, --json, --help and --version", option);
}

int command_getopt(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        struct option longopts[COMMAND_OPTIONS_MAX + 4] = {};
        char shortopts[2 * COMMAND_OPTIONS_MAX + 4];
        size_t n = 0, k;

        /* '+': options end at the first argument, so that a command's own
         * options stay its own. */
        snprintf(shortopts, sizeof shortopts, "%s:h", cmd->flags & COMMAND_OPTIONS_FIRST ? "+" : "");
        k = strlen(shortopts);

        for (const CommandOption *o = cmd->options; o && o->name && n < COMMAND_OPTIONS_MAX; o++) {
                longopts[n++] = (struct option) { o->name, o->value ? required_argument : no_argument, NULL, o->id };
                if (o->id < 0x100) {
                        shortopts[k++] = (char) o->id;
                        if (o->value)
                                shortopts[k++] = ':';
                }
        }
        shortopts[k] = '\0';
        longopts[n++] = (struct option) { "help", no_argument, NULL, 'h' };
        if (cmd->flags & COMMAND_JSON)
                longopts[n++] = (struct option) { "json", no_argument, NULL, ARG_JSON };
        if (cmd->flags & COMMAND_SIZES)
                longopts[n++] = (struct option) { "raw", no_argument, NULL, ARG_RAW };

        opterr = 0;     /* getopt's messages would name the verb as the program */
        for (;;) {
                int c = getopt_long(argc, argv, shortopts, longopts, NULL);

                switch (c) {
                case -1:
                        if (tool->json && !(cmd->flags & COMMAND_JSON)) {
                                (void) report_usage_error(cmd, "'%s' prints no result, so it takes no --json",
                                                          cmd->name);
                                return OPTIONS_INVALID;
                        }
                        return 0;
                case 'h':
                        command_help(cmd);
                        return OPTIONS_HELP;
                case ARG_JSON:
                        tool->json = true;
                        break;
                case ARG_RAW:
                        tool->raw = true;
                        break;
                case ':':
                case '?':
                        (void) report_option_error(cmd, c, argc, argv);
                        return OPTIONS_INVALID;
                default:
                        return c;
                }
        }
}

int options_exit_status(int c) {
        return c == OPTIONS_HELP ? EXIT_SUCCESS : EXIT_USAGE;
}

int command_check_arguments(const Command *cmd, int argc, char *argv[], int min, int max) {
        const char *space = isempty(cmd->synopsis) ? "" : " ";
        const char *synopsis = cmd->synopsis ? cmd->synopsis : "";
        int n = argc - optind;

        if (n < min)
                return report_usage_error(cmd, "missing %s for '%s' (usage: " PROGRAM_NAME " %s%s%s)",
                                          min - n == 1 ? "an argument" : "arguments",
                                          cmd->name, cmd->name, space, synopsis);
        if (n > max)
                return report_usage_error(cmd, "unexpected argument '%s' for '%s' (usage: " PROGRAM_NAME " %s%s%s)",
                                          argv[optind + max], cmd->name, cmd->name, space, synopsis);
        return 0;
}

int command_check_name(const Command *cmd, const char *name) {
        if (store_name_is_valid(name))
                return 0;

        return report_usage_error(cmd, "%s%s%s is not a valid subvolume name: a name is 1 to %d bytes, "
                                  "without '/' or control characters, and not '.' or '..'",
                                  string_is_printable(name) ? "'" : "",
                                  string_is_printable(name) ? name : "the name given",
                                  string_is_printable(name) ? "'" : "",
                                  STORE_NAME_MAX);
}

int command_check_new_name(const Command *cmd, const char *name) {
        int r = command_check_name(cmd, name);

        if (r == 0 && startswith(name, IMAGE_RECEIVING_PREFIX))
                return report_usage_error(cmd, "'%s': names starting with '" IMAGE_RECEIVING_PREFIX "' are those of "
                                          "images being received", name);
        return r;
}

/* ---- help ---- */

static const char *command_verb(const Command *cmd) {
        const char *space = strrchr(cmd->name, ' ');

        return space ? space + 1 : cmd->name;
}

#define HELP_COLUMNS 80

/* The usage line, wrapped to HELP_COLUMNS at spaces outside brackets (an
 * option stays whole: "[--proto 1|2]"), its further lines indented under
 * the command's name. */
static void print_usage_line(const char *lead, const Command *cmd) {
        _cleanup_free_ char *line = NULL;
        size_t column = 0, indent;
        const char *p;

        if (asprintf(&line, "%s" PROGRAM_NAME " [--store=DIR]%s %s%s%s", lead,
                     (cmd->flags & COMMAND_JSON) ? " [--json]" : "", cmd->name,
                     isempty(cmd->synopsis) ? "" : " ", cmd->synopsis ? cmd->synopsis : "") < 0) {
                puts(cmd->name);
                return;
        }
        indent = strlen(lead) + strlen(PROGRAM_NAME) + 1;
        for (p = line; *p; ) {
                size_t n = 0;
                int depth = 0;

                /* One word: up to a space outside brackets. */
                while (p[n] && (p[n] != ' ' || depth > 0)) {
                        depth += p[n] == '[' ? 1 : p[n] == ']' ? -1 : 0;
                        n++;
                }
                if (column > indent && column + 1 + n > HELP_COLUMNS) {
                        printf("\n%*s", (int) indent, "");
                        column = indent;
                } else if (column > 0) {
                        putchar(' ');
                        column++;
                }
                printf("%.*s", (int) n, p);
                column += n;
                p += n;
                while (*p == ' ')
                        p++;
        }
        putchar('\n');
}

/* An option and its help; a help text may go on over lines split by '\n'. */
static void print_option(int id, const char *name, const char *value, const char *help) {
        char flags[64];

        snprintf(flags, sizeof(flags), "%c%c%s--%s%s%s",
                 id < 0x100 ? '-' : ' ', id < 0x100 ? id : ' ', id < 0x100 ? ", " : "  ",
                 name, value ? "=" : "", value ? value : "");
        printf("  %-18s", flags);

        for (const char *line = help; line; ) {
                const char *end = strchr(line, '\n');

                printf("%*s%.*s\n", line == help ? 2 : 22, "",
                       (int) (end ? (size_t) (end - line) : strlen(line)), line);
                line = end ? end + 1 : NULL;
        }
}

static void print_store_option(void) {
        print_option(ARG_STORE, "store", "DIR", "the store (default: $COWBOX_STORE, else "
                     STORE_DEFAULT_PATH ")");
}

static void print_environment(void) {
        fputs("\nEnvironment:\n"
              "  COWBOX_STORE        the store to use when --store is not given\n", stdout);
}

/* What every command's help ends with, before its examples. */
static void print_global_sections(void) {
        fputs("\nGlobal options (before the command):\n", stdout);
        print_store_option();
        print_environment();
}

static void print_examples(const char *const *examples) {
        if (!examples)
                return;
        fputs("\nExamples:\n", stdout);
        for (const char *const *e = examples; *e; e++)
                printf("  %s\n", *e);
}

static void print_command_list(const Command *const *table) {
        for (; *table; table++) {
                const Command *cmd = *table;

                if (cmd->verbs) {
                        print_command_list(cmd->verbs);
                        continue;
                }
                printf("  %s%s%s\n      %s\n", cmd->name, isempty(cmd->synopsis) ? "" : " ",
                       cmd->synopsis ? cmd->synopsis : "", cmd->summary);
        }
}

static void verb_help(const Command *cmd) {
        print_usage_line("Usage: ", cmd);
        printf("\n%s\n", cmd->summary);
        if (cmd->description)
                printf("\n%s", cmd->description);

        fputs("\nOptions:\n", stdout);
        for (const CommandOption *o = cmd->options; o && o->name; o++)
                print_option(o->id, o->name, o->value, o->help);
        if (cmd->flags & COMMAND_SIZES)
                print_option(ARG_RAW, "raw", NULL, "print sizes as exact byte counts, not as 1.2 MiB");
        if (cmd->flags & COMMAND_JSON)
                print_option(ARG_JSON, "json", NULL, cmd->flags & COMMAND_REPORT_ON_STDERR ?
                             "print the result as one JSON document on standard\n"
                             "error (also accepted before the command)" :
                             "print the result as one JSON document on standard\n"
                             "output (also accepted before the command)");
        print_option('h', "help", NULL, "show this help and exit");

        print_global_sections();
        print_examples(cmd->examples);
}

static void noun_help(const Command *cmd) {
        print_usage_line("Usage: ", cmd);
        printf("\n%s\n", cmd->summary);
        if (cmd->description)
                printf("\n%s", cmd->description);

        fputs("\nCommands:\n", stdout);
        print_command_list(cmd->verbs);

        fputs("\nOptions:\n", stdout);
        print_option('h', "help", NULL, "show this help; after a command, its help");

        print_global_sections();
        print_examples(cmd->examples);
}

void command_help(const Command *cmd) {
        if (cmd->verbs)
                noun_help(cmd);
        else
                verb_help(cmd);
}

static const Command help_command;

static const Command *const commands[] = {
        &command_init,
        &command_subvolume,
        &command_usage,
        &command_mount,
        &command_reap,
        &command_scrub,
        &command_fsck,
        &command_receive,
        &command_send,
        &command_run,
        &help_command,
        NULL,
};

static void tool_help(void) {
        fputs("Usage: " PROGRAM_NAME " [--store=DIR] [--json] COMMAND [ARGS...]\n"
              "       " PROGRAM_NAME " help [COMMAND...]\n"
              "       " PROGRAM_NAME " --help | --version\n"
              "\n"
              "Administer a cowbox copy-on-write snapshot store directly, without the daemon.\n"
              "\n"
              "A store is a directory of subvolumes: trees of files that are snapshotted and\n"
              "deleted in constant time whatever their size, with their data compressed,\n"
              "deduplicated and checksummed. " PROGRAM_NAME " creates a store, manages its\n"
              "subvolumes, mounts them through FUSE, frees the space of deleted subvolumes,\n"
              "and checks the store for damage. It works on the store directly: several\n"
              "processes, the daemon among them, may use one store at the same time.\n"
              "\n"
              "Commands:\n", stdout);
        print_command_list(commands);

        fputs("\nGlobal options (before the command):\n", stdout);
        print_store_option();
        print_option(ARG_JSON, "json", NULL, "print the result as one JSON document on standard\n"
                     "output (run: standard error; also accepted after the\n"
                     "command)");
        print_option('h', "help", NULL, "show this help; after a command, its help");
        print_option(ARG_VERSION, "version", NULL, "print the version and exit");
        print_environment();

        fputs("\nExit status:\n"
              "  0  success\n"
              "  1  failure; for scrub, damaged blocks were found; for fsck, problems remain\n"
              "  2  usage error: unknown command or option, wrong arguments, invalid name\n"
              "\n"
              "Examples:\n"
              "  " PROGRAM_NAME " --store=/srv/cowbox init\n"
              "  " PROGRAM_NAME " subvolume create base\n"
              "  " PROGRAM_NAME " subvolume snapshot --readonly base base-v1\n"
              "  " PROGRAM_NAME " --json usage\n"
              "  " PROGRAM_NAME " help subvolume snapshot\n", stdout);
}

/* ---- dispatch ---- */

static const Command *command_find(const Command *const *table, const char *verb) {
        for (; *table; table++)
                if (streq(command_verb(*table), verb))
                        return *table;
        return NULL;
}

/* "create, snapshot, delete, list or show" */
static const char *format_verb_list(const Command *const *table, char *buf, size_t size) {
        size_t n = 0, used = 0;

        while (table[n])
                n++;
        buf[0] = '\0';
        for (size_t i = 0; i < n; i++) {
                const char *separator = i == 0 ? "" : i + 1 == n ? " or " : ", ";
                int k = snprintf(buf + used, size - used, "%s%s", separator, command_verb(table[i]));

                if (k < 0 || (size_t) k >= size - used)
                        break;
                used += (size_t) k;
        }
        return buf;
}

/* Finds the command that argv[0] names in table (parent's verbs, or the top
 * level when parent is NULL), and runs it with argv[0] as its verb. */
static int dispatch(Tool *tool, const Command *const *table, const Command *parent, int argc, char *argv[]) {
        const Command *cmd;
        char verbs[256];

        if (argc < 1) {
                if (!parent)
                        return report_usage_error(NULL, "no command given (try 'init', "
                                                  "'subvolume list' or 'usage')");
                return report_usage_error(parent, "'%s' needs a command: %s", parent->name,
                                          format_verb_list(table, verbs, sizeof(verbs)));
        }

        if (parent && (streq(argv[0], "--help") || streq(argv[0], "-h"))) {
                command_help(parent);
                return EXIT_SUCCESS;
        }

        cmd = command_find(table, argv[0]);
        if (!cmd) {
                if (parent)
                        return report_usage_error(parent, "'%s' has no command '%s'; its commands are %s",
                                                  parent->name, argv[0],
                                                  format_verb_list(table, verbs, sizeof(verbs)));
                return report_usage_error(NULL, "unknown command '%s'", argv[0]);
        }

        if (cmd->verbs)
                return dispatch(tool, cmd->verbs, cmd, argc - 1, argv + 1);

        optind = 0;     /* a fresh getopt scan over the verb's own argv */
        return cmd->run(tool, cmd, argc, argv);
}

static int run_help(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        const Command *const *table = commands;
        const Command *found = NULL;

        for (int i = 1; i < argc; i++)
                if (streq(argv[i], "--help") || streq(argv[i], "-h")) {
                        command_help(cmd);
                        return EXIT_SUCCESS;
                }
        for (int i = 1; i < argc; i++) {
                if (!table)
                        return report_usage_error(NULL, "'%s' has no commands of its own", found->name);
                found = command_find(table, argv[i]);
                if (!found)
                        return report_usage_error(NULL, "there is no command '%s'%s%s", argv[i],
                                                  i > 1 ? " in " : "", i > 1 ? argv[i - 1] : "");
                table = found->verbs;
        }

        if (found)
                command_help(found);
        else
                tool_help();
        return EXIT_SUCCESS;
}

static const Command help_command = {
        .name = "help",
        .synopsis = "[COMMAND...]",
        .summary = "Show the help of " PROGRAM_NAME ", or of a command.",
        .examples = (const char *const[]) {
                PROGRAM_NAME " help subvolume",
                PROGRAM_NAME " help subvolume snapshot",
                NULL,
        },
        .run = run_help,
};


/* Returns > 0 to go on to the command, 0 when done (help, version), < 0 on a usage error. */
static int parse_global_options(Tool *tool, int argc, char *argv[]) {
        static const struct option options[] = {
                { "store",   required_argument, NULL, ARG_STORE   },
                { "json",    no_argument,       NULL, ARG_JSON    },
                { "help",    no_argument,       NULL, 'h'         },
                { "version", no_argument,       NULL, ARG_VERSION },
                {}
        };
        const char *env = getenv("COWBOX_STORE");
        int c;

        tool->store_path = isempty(env) ? STORE_DEFAULT_PATH : env;

        opterr = 0;
        /* '+': stop at the command; what follows it is the command's. */
        while ((c = getopt_long(argc, argv, "+:h", options, NULL)) >= 0)
                switch (c) {
                case ARG_STORE:
                        if (isempty(optarg)) {
                                (void) report_usage_error(NULL, "--store needs a directory, as in --store=DIR");
                                return -EINVAL;
                        }
                        tool->store_path = optarg;
                        break;
                case ARG_JSON:
                        tool->json = true;
                        break;
                case 'h':
                        tool_help();
                        return 0;
                case ARG_VERSION:
                        puts(PROGRAM_NAME " " COWBOX_VERSION);
                        return 0;
                default:
                        (void) report_option_error(NULL, c, argc, argv);
                        return -EINVAL;
                }

        return 1;
}

/* Output that could not be written is a failure, not a success (think of a full disk). */
static int finish_output(int status) {
        if (fflush(stdout) != 0 || ferror(stdout)) {
                (void) report_failure("cannot write to standard output: %s",
                                      errno > 0 ? strerror(errno) : "I/O error");
                return EXIT_FAILURE;
        }
        return status;
}

int main(int argc, char *argv[]) {
        Tool tool = {};
        int r;

        r = parse_global_options(&tool, argc, argv);
        if (r <= 0)
                return finish_output(r < 0 ? EXIT_USAGE : EXIT_SUCCESS);

        r = dispatch(&tool, commands, NULL, argc - optind, argv + optind);
        return finish_output(r);
}

int parse_number(const char *text, uint64_t *ret) {
        char *end = NULL;
        unsigned long long v;

        /* strtoull() would take "-1" as 2^64 - 1. */
        if (!isdigit((unsigned char) text[0]))
                return -EINVAL;
        errno = 0;
        v = strtoull(text, &end, 10);
        if (errno || *end)
                return -EINVAL;
        *ret = v;
        return 0;
}

/* SIZE: a number of bytes with an optional binary unit (K, M, G, T, with or
 * without "iB"), or "none" or 0 for no limit. */
int parse_size(const char *text, uint64_t *ret) {
        static const char units[] = "KMGT";
        unsigned long long n;
        const char *unit;
        char *end;

        if (streq(text, "none")) {
                *ret = 0;
                return 0;
        }
        if (!isdigit((unsigned char) text[0]))
                return -EINVAL;
        errno = 0;
        n = strtoull(text, &end, 10);
        if (errno != 0)
                return errno == ERANGE ? -ERANGE : -EINVAL;
        if (*end == 0) {
                *ret = n;
                return 0;
        }
        unit = strchr(units, toupper((unsigned char) *end));
        if (!unit || !(streq(end + 1, "") || streq(end + 1, "iB") || streq(end + 1, "B")))
                return -EINVAL;
        for (const char *u = units; u <= unit; u++) {
                if (n > UINT64_MAX / 1024)
                        return -ERANGE;
                n *= 1024;
        }
        *ret = n;
        return 0;
}
