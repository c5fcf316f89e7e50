/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * fill-inodes: makes a subvolume of many files quickly, for benchmarks of
 * how the store scales with the number of inodes.
 *
 * Loading millions of files through a FUSE mount takes hours; this goes
 * through the store's own file API (what the FUSE server and receive use),
 * so the subvolume it makes is one a mount could have made. Files go into
 * directories of at most --per-dir entries, the directories into parents
 * of at most --per-dir directories: d0000/d0001/f000123. Each file holds
 * --bytes bytes of text that differs from file to file (inline in the
 * metadata below the inline limit, as small files are).
 *
 * It prints one line of JSON: files, directories, seconds.
 */

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cleanup.h"
#include "store.h"
#include "time-util.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(Store *, store_close);
DEFINE_TRIVIAL_CLEANUP_FUNC(Volume *, volume_close);

typedef struct Options {
        const char *store;
        const char *name;
        uint64_t files;
        uint64_t per_dir;
        size_t bytes;
        bool progress;
} Options;

static void help(void) {
        printf("Usage: fill-inodes [OPTIONS] STORE NAME FILES\n\n"
               "Create subvolume NAME in STORE holding FILES files, through the\n"
               "store's file API, and print files, directories and seconds as JSON.\n\n"
               "  --per-dir N     entries of a directory at most (default 1000)\n"
               "  --bytes N       bytes of each file (default 0)\n"
               "  --progress      print progress to standard error\n"
               "  -h, --help      show this help\n");
}

static int parse_count(const char *text, uint64_t *ret) {
        char *end;

        errno = 0;
        unsigned long long n = strtoull(text, &end, 10);
        if (errno != 0 || end == text || *end != '\0' || text[0] == '-')
                return -EINVAL;
        *ret = n;
        return 0;
}

static int parse_options(int argc, char **argv, Options *o) {
        static const struct option options[] = {
                { "per-dir",  required_argument, NULL, 'd' },
                { "bytes",    required_argument, NULL, 'b' },
                { "progress", no_argument,       NULL, 'p' },
                { "help",     no_argument,       NULL, 'h' },
                {}
        };
        uint64_t n;
        int c;

        *o = (Options) { .per_dir = 1000 };
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                switch (c) {
                case 'd':
                        if (parse_count(optarg, &o->per_dir) < 0 || o->per_dir < 2) {
                                fprintf(stderr, "fill-inodes: --per-dir needs a number of at least 2\n");
                                return -EINVAL;
                        }
                        break;
                case 'b':
                        if (parse_count(optarg, &n) < 0 || n > 1024 * 1024) {
                                fprintf(stderr, "fill-inodes: --bytes needs a number up to 1048576\n");
                                return -EINVAL;
                        }
                        o->bytes = n;
                        break;
                case 'p':
                        o->progress = true;
                        break;
                case 'h':
                        help();
                        exit(EXIT_SUCCESS);
                default:
                        return -EINVAL;
                }

        if (argc - optind != 3 || parse_count(argv[optind + 2], &o->files) < 0) {
                fprintf(stderr, "fill-inodes: needs STORE NAME FILES; see --help\n");
                return -EINVAL;
        }
        o->store = argv[optind];
        o->name = argv[optind + 1];
        return 0;
}

/* Text that differs from file to file, so that no two files share a block
 * or compress to nothing. */
static void file_text(char *buf, size_t size, uint64_t i) {
        size_t n = 0;

        while (n < size)
                n += (size_t) snprintf(buf + n, size - n + 1, "int f%llu_%zu(void) { return %llu; }\n",
                                       (unsigned long long) i, n, (unsigned long long) (i * 2654435761u));
}

static int make_dir(Volume *v, uint64_t parent, const char *name, uint64_t *ret) {
        struct stat st;
        int r;

        r = volume_mkdir(v, parent, name, 0755, 0, 0, &st);
        if (r < 0)
                return r;
        *ret = st.st_ino;
        return 0;
}

static int fill(Volume *v, const Options *o, uint64_t *ret_dirs) {
        _cleanup_free_ char *text = NULL;
        uint64_t top = 0, dir = 0, dirs = 0, last_report = 0;
        char name[32];
        int r;

        if (o->bytes > 0) {
                text = malloc(o->bytes + 96);
                if (!text)
                        return -ENOMEM;
        }

        for (uint64_t i = 0; i < o->files; i++) {
                uint64_t in_dir = i % o->per_dir, dir_no = i / o->per_dir;
                struct stat st;

                if (in_dir == 0) {
                        if (dir_no % o->per_dir == 0) {
                                snprintf(name, sizeof name, "d%04llu", (unsigned long long) (dir_no / o->per_dir));
                                r = make_dir(v, VOLUME_ROOT_INO, name, &top);
                                if (r < 0)
                                        return r;
                                dirs++;
                        }
                        snprintf(name, sizeof name, "d%04llu", (unsigned long long) (dir_no % o->per_dir));
                        r = make_dir(v, top, name, &dir);
                        if (r < 0)
                                return r;
                        dirs++;
                }

                snprintf(name, sizeof name, "f%06llu", (unsigned long long) in_dir);
                r = volume_mknod(v, dir, name, S_IFREG | 0644, 0, 0, 0, &st);
                if (r < 0)
                        return r;
                if (text) {
                        file_text(text, o->bytes, i);
                        ssize_t n = volume_write(v, st.st_ino, text, o->bytes, 0);
                        if (n < 0)
                                return (int) n;
                }
                volume_forget(v, st.st_ino);

                if (o->progress && ratelimit_due(&last_report, 2 * 1000000u, i + 1 == o->files))
                        fprintf(stderr, "fill-inodes: %llu of %llu files\n",
                                (unsigned long long) (i + 1), (unsigned long long) o->files);
        }

        *ret_dirs = dirs;
        return volume_sync(v);
}

int main(int argc, char **argv) {
        _cleanup_(store_closep) Store *s = NULL;
        _cleanup_(volume_closep) Volume *v = NULL;
        uint64_t dirs = 0, start;
        Options o;
        int r;

        if (parse_options(argc, argv, &o) < 0)
                return 2;

        r = store_open(o.store, &s);
        if (r < 0) {
                fprintf(stderr, "fill-inodes: cannot open store %s: %s\n", o.store, store_strerror(r));
                return 1;
        }
        r = store_subvolume_create(s, o.name);
        if (r < 0) {
                fprintf(stderr, "fill-inodes: cannot create subvolume %s: %s\n", o.name, store_strerror(r));
                return 1;
        }
        r = volume_open(s, o.name, true, &v, NULL);
        if (r < 0) {
                fprintf(stderr, "fill-inodes: cannot open subvolume %s: %s\n", o.name, store_strerror(r));
                return 1;
        }

        start = monotonic_usec();
        r = fill(v, &o, &dirs);
        if (r < 0) {
                fprintf(stderr, "fill-inodes: filling %s failed: %s\n", o.name, store_strerror(r));
                return 1;
        }
        v = volume_close(v);

        printf("{\"files\": %llu, \"directories\": %llu, \"seconds\": %.3f}\n",
               (unsigned long long) o.files, (unsigned long long) dirs,
               (double) (monotonic_usec() - start) / 1000000u);
        return 0;
}
