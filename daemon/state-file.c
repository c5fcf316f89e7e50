/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cleanup.h"
#include "state-file.h"

int state_file_load(const char *path, const char *what, size_t flags, json_t **ret, char **ret_error) {
        json_error_t jerr;
        json_t *doc;
        int r;

        *ret = NULL;
        doc = json_load_file(path, flags, &jerr);
        if (doc) {
                *ret = doc;
                return 0;
        }
        if (access(path, F_OK) < 0 && errno == ENOENT)
                return 0;
        if (json_error_code(&jerr) == json_error_cannot_open_file) {
                r = -EIO;
                if (asprintf(ret_error, "cannot read the list of %s %s: %s", what, path, jerr.text) < 0)
                        *ret_error = NULL;
        } else {
                r = -EUCLEAN;
                if (asprintf(ret_error, "the list of %s %s is damaged (line %d, column %d: %s); cowboxd does not "
                             "start without it, so as not to forget them: repair it, or move it aside to start "
                             "with none", what, path, jerr.line, jerr.column, jerr.text) < 0)
                        *ret_error = NULL;
        }
        return r;
}

int state_file_save(const char *path, json_t *doc) {
        _cleanup_free_ char *tmp = NULL, *dir_path = NULL;
        _cleanup_close_ int dir = -EBADF;
        FILE *f;
        int fd, r = 0;

        if (asprintf(&tmp, "%s.tmp", path) < 0 || !(dir_path = strdup(path)))
                return -ENOMEM;
        /* root's alone, also one a crash left: a sandbox's record holds its
         * task's output. */
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        f = fchmod(fd, 0600) < 0 ? NULL : fdopen(fd, "we");
        if (!f) {
                r = -errno;
                safe_close(fd);
                (void) unlink(tmp);
                return r;
        }
        if (json_dumpf(doc, f, JSON_INDENT(2)) < 0 || fflush(f) != 0 || fsync(fileno(f)) < 0)
                r = -EIO;
        if (fclose(f) != 0 && r == 0)
                r = -errno;
        if (r == 0 && rename(tmp, path) < 0)
                r = -errno;
        if (r < 0) {
                (void) unlink(tmp);
                return r;
        }
        dir = open(dirname(dir_path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir >= 0)
                (void) fsync(dir);
        return 0;
}
