/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * hash-speed: the CPU time the store's block check takes over a file, for
 * store-speed's checksum share.
 *
 * Every block the store reads is verified with XXH3-128 keyed by a 192-byte
 * secret, over at most 64 KiB of content. This hashes FILE the same way,
 * built with the same xxHash settings as the store (basic/xxhash-util.h):
 * a tool such as xxhsum may use other vector code than the store does, and
 * would measure that instead. Each block is read into a buffer and hashed
 * there, as the store hashes a block it has just read or decompressed; only
 * the hashing is timed.
 *
 * It prints one line of JSON: bytes, seconds (of hashing).
 */

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cleanup.h"
#include "xxhash-util.h"

#define BLOCK_BYTES (64 * 1024)
#define SECRET_BYTES 192

/* The monotonic clock, read without a system call (the CPU-time clocks make
 * one, which would cost more than hashing a block); a block's hash is too
 * short to be preempted often. */
static double now_seconds(void) {
        struct timespec ts;

        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

int main(int argc, char *argv[]) {
        _cleanup_close_ int fd = -EBADF;
        static uint8_t block[BLOCK_BYTES];
        uint8_t secret[SECRET_BYTES];
        uint64_t fold = 0, bytes = 0;
        double seconds = 0;

        if (argc != 2) {
                fprintf(stderr, "usage: %s FILE\n", program_invocation_short_name);
                return 2;
        }
        fd = open(argv[1], O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
                fprintf(stderr, "%s: %s: %m\n", program_invocation_short_name, argv[1]);
                return 1;
        }
        for (size_t i = 0; i < sizeof secret; i++)
                secret[i] = (uint8_t) (i * 167 + 13);

        for (;;) {
                ssize_t n = read(fd, block, sizeof block);
                XXH128_hash_t h;
                double start;

                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        fprintf(stderr, "%s: cannot read %s: %m\n", program_invocation_short_name, argv[1]);
                        return 1;
                }
                if (n == 0)
                        break;
                start = now_seconds();
                h = XXH3_128bits_withSecret(block, (size_t) n, secret, sizeof secret);
                seconds += now_seconds() - start;
                fold ^= h.low64 ^ h.high64;     /* keeps the calls from being optimized away */
                bytes += (uint64_t) n;
        }
        printf("{\"bytes\": %llu, \"seconds\": %.6f, \"fold\": %llu}\n",
               (unsigned long long) bytes, seconds, (unsigned long long) fold);
        return 0;
}
