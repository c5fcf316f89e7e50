/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * A libFuzzer target for receive: each input is applied to a real store as
 * a stream. Whatever the input, receive must fail cleanly or make images,
 * and never crash, hang or leak (the sanitizers watch).
 *
 * The store lives in a temporary directory made at start. With
 * COWBOX_FUZZ_PARENT naming a stream file, that stream is received first,
 * so that increments on it (in the seed corpus) reach their commands.
 *
 * The checksums of a plain stream's commands are set right before it is
 * received: a mutation would otherwise fail at the first command it
 * touches, and never reach the code that applies the commands.
 *
 *   fuzz-receive -max_total_time=60 CORPUS_DIR tests/fuzz-corpus
 */

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "images.h"
#include "store.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static Store *store;
static char store_dir[] = "/tmp/cowbox-fuzz-XXXXXX";
static unsigned runs;

static void remove_store(void) {
        char cmd[128];

        store_close(store);
        snprintf(cmd, sizeof cmd, "rm -rf -- '%s'", store_dir);
        (void) !system(cmd);
}

/* CRC-32C as send streams use it: initial value 0, no final inversion. */
static uint32_t crc32c(uint32_t crc, const uint8_t *p, size_t len) {
        while (len--) {
                crc ^= *p++;
                for (unsigned k = 0; k < 8; k++)
                        crc = crc & 1 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
        }
        return crc;
}

static uint32_t get_le32(const uint8_t *p) {
        return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

/* Gives every whole command of the plain streams in buf its checksum. */
static void fix_checksums(uint8_t *buf, size_t size) {
        static const char magic[] = "btrfs-stream";
        size_t pos = 0;

        while (size - pos >= 17 && memcmp(buf + pos, magic, sizeof magic) == 0) {
                pos += 17;
                while (size - pos >= 10) {
                        uint32_t len = get_le32(buf + pos), crc;
                        unsigned cmd = buf[pos + 4] | buf[pos + 5] << 8;

                        if (len > size - pos - 10)
                                return;
                        memset(buf + pos + 6, 0, 4);
                        crc = crc32c(0, buf + pos, 10 + (size_t) len);
                        for (unsigned i = 0; i < 4; i++)
                                buf[pos + 6 + i] = (uint8_t) (crc >> (8 * i));
                        pos += 10 + (size_t) len;
                        if (cmd == 21)  /* END: another stream may follow */
                                break;
                }
        }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        const char *parent = getenv("COWBOX_FUZZ_PARENT");

        if (!mkdtemp(store_dir) || rmdir(store_dir) < 0 || store_init(store_dir) < 0 ||
            store_open(store_dir, &store) < 0) {
                fprintf(stderr, "fuzz-receive: cannot make a store in %s\n", store_dir);
                exit(EXIT_FAILURE);
        }
        atexit(remove_store);

        if (parent) {
                ImageReceiveOptions opts = { .no_background_reap = true };
                ImageError error = {};
                char **names = NULL;
                int fd = open(parent, O_RDONLY | O_CLOEXEC);

                if (fd < 0 || image_receive(store, fd, &opts, &names, &error) < 0) {
                        fprintf(stderr, "fuzz-receive: cannot receive %s: %s\n", parent, error.message);
                        exit(EXIT_FAILURE);
                }
                image_names_free(names);
                close(fd);
        }
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        ImageReceiveOptions opts = { .no_background_reap = true };
        ImageError error = {};
        char **names = NULL;
        uint8_t *copy = malloc(size ? size : 1);
        int fd;

        if (!copy)
                abort();
        memcpy(copy, data, size);
        fix_checksums(copy, size);
        fd = memfd_create("stream", MFD_CLOEXEC);
        if (fd < 0 || (size > 0 && write(fd, copy, size) != (ssize_t) size) || lseek(fd, 0, SEEK_SET) < 0)
                abort();
        free(copy);

        if (image_receive(store, fd, &opts, &names, &error) >= 0) {
                /* Keep the store small: what was made goes again. */
                for (char **n = names; *n; n++)
                        (void) store_subvolume_delete(store, *n, NULL);
                image_names_free(names);
        } else if (error.message[0] == 0)
                abort();        /* every failure says why */
        close(fd);

        if (++runs % 64 == 0)
                (void) store_reap(store, true, NULL, NULL, NULL, NULL);
        return 0;
}
