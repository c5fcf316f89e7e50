/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * A disk whose every write and flush is recorded, for the power loss test:
 * serves one file, "disk", backed by an image file, through FUSE; a loop
 * device on it carries a real file system. Every write (and zeroed range)
 * is applied to the image and appended to a log, every fsync (a flush of
 * the loop device: the point up to which the disk's cache must have
 * reached the platter) appends a flush record. Replaying a prefix of the
 * log onto the image as it was at the start gives the disk as a power loss
 * at that point could leave it. Reading the file "pos" gives the number of
 * records so far, to place events in the log.
 *
 * Log records: u32 type (1 write, 2 flush, 3 zeros), u32 zero, u64 offset,
 * u64 length, then for a write its bytes; little-endian (the host's).
 *
 *   blocklog IMAGE LOG MOUNTPOINT [FUSE OPTIONS]
 */

#define FUSE_USE_VERSION 35

#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <inttypes.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { REC_WRITE = 1, REC_FLUSH = 2, REC_ZERO = 3 };

struct record {
        uint32_t type;
        uint32_t zero;
        uint64_t offset;
        uint64_t length;
};

static int image_fd = -1;
static FILE *log_file;
static uint64_t image_size;
static uint64_t records;

static int log_record(uint32_t type, uint64_t offset, uint64_t length, const void *data) {
        struct record r = { .type = type, .offset = offset, .length = length };

        if (fwrite(&r, sizeof r, 1, log_file) != 1)
                return -EIO;
        if (data && length > 0 && fwrite(data, length, 1, log_file) != 1)
                return -EIO;
        records++;
        return 0;
}

static int bl_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
        memset(st, 0, sizeof *st);
        if (strcmp(path, "/") == 0) {
                st->st_mode = S_IFDIR | 0755;
                st->st_nlink = 2;
        } else if (strcmp(path, "/disk") == 0) {
                st->st_mode = S_IFREG | 0600;
                st->st_nlink = 1;
                st->st_size = (off_t) image_size;
        } else if (strcmp(path, "/pos") == 0) {
                st->st_mode = S_IFREG | 0444;
                st->st_nlink = 1;
                st->st_size = 32;
        } else
                return -ENOENT;
        return 0;
}

static int bl_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off, struct fuse_file_info *fi,
                      enum fuse_readdir_flags flags) {
        if (strcmp(path, "/") != 0)
                return -ENOENT;
        fill(buf, ".", NULL, 0, 0);
        fill(buf, "..", NULL, 0, 0);
        fill(buf, "disk", NULL, 0, 0);
        fill(buf, "pos", NULL, 0, 0);
        return 0;
}

static int bl_open(const char *path, struct fuse_file_info *fi) {
        if (strcmp(path, "/disk") != 0 && strcmp(path, "/pos") != 0)
                return -ENOENT;
        fi->direct_io = 1; /* every read and write reaches us */
        return 0;
}

static int bl_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
        if (strcmp(path, "/pos") == 0) {
                char text[32];
                int n = snprintf(text, sizeof text, "%" PRIu64 "\n", records);

                if (off >= n)
                        return 0;
                size = size < (size_t) (n - off) ? size : (size_t) (n - off);
                memcpy(buf, text + off, size);
                return (int) size;
        }
        ssize_t k = pread(image_fd, buf, size, off);
        return k < 0 ? -errno : (int) k;
}

static int bl_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
        if (strcmp(path, "/disk") != 0)
                return -EACCES;
        if ((uint64_t) off + size > image_size)
                return -ENOSPC;
        ssize_t k = pwrite(image_fd, buf, size, off);
        if (k < 0)
                return -errno;
        int r = log_record(REC_WRITE, (uint64_t) off, (uint64_t) k, buf);
        return r < 0 ? r : (int) k;
}

static int bl_fallocate(const char *path, int mode, off_t off, off_t len, struct fuse_file_info *fi) {
        if (strcmp(path, "/disk") != 0)
                return -EACCES;
        if (!(mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)))
                return mode == 0 ? 0 : -EOPNOTSUPP;
        if (fallocate(image_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len) < 0)
                return -errno;
        return log_record(REC_ZERO, (uint64_t) off, (uint64_t) len, NULL);
}

static int bl_fsync(const char *path, int datasync, struct fuse_file_info *fi) {
        
        return log_record(REC_FLUSH, 0, 0, NULL);
}

static int bl_truncate(const char *path, off_t size, struct fuse_file_info *fi) {
        return (uint64_t) size == image_size ? 0 : -EPERM;
}

static void bl_destroy(void *data) {
        if (fflush(log_file) != 0 || fsync(fileno(log_file)) < 0)
                fprintf(stderr, "blocklog: cannot write the log: %m\n");
}

static const struct fuse_operations ops = {
        .getattr = bl_getattr,
        .readdir = bl_readdir,
        .open = bl_open,
        .read = bl_read,
        .write = bl_write,
        .fallocate = bl_fallocate,
        .fsync = bl_fsync,
        .truncate = bl_truncate,
        .destroy = bl_destroy,
};

int main(int argc, char *argv[]) {
        struct stat st;

        if (argc < 4) {
                fprintf(stderr, "usage: blocklog IMAGE LOG MOUNTPOINT [FUSE OPTIONS]\n");
                return 2;
        }
        image_fd = open(argv[1], O_RDWR | O_CLOEXEC);
        if (image_fd < 0 || fstat(image_fd, &st) < 0) {
                fprintf(stderr, "blocklog: %s: %m\n", argv[1]);
                return 1;
        }
        image_size = (uint64_t) st.st_size;
        log_file = fopen(argv[2], "we");
        if (!log_file) {
                fprintf(stderr, "blocklog: %s: %m\n", argv[2]);
                return 1;
        }
        (void) setvbuf(log_file, NULL, _IOFBF, 4 << 20);

        /* blocklog MOUNTPOINT -s [options]: one thread, so that the log's
         * order is the order in which requests were answered. */
        char *fuse_argv[64];
        int n = 0;

        if (argc > 60) {
                fprintf(stderr, "blocklog: too many options\n");
                return 2;
        }
        fuse_argv[n++] = argv[0];
        fuse_argv[n++] = argv[3];
        fuse_argv[n++] = (char *) "-s";
        for (int i = 4; i < argc; i++)
                fuse_argv[n++] = argv[i];
        return fuse_main(n, fuse_argv, &ops, NULL);
}
