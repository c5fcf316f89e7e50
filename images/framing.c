/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The transport of send streams. A stream travels either as it is (it
 * starts with "btrfs-stream"), or framed: compressed as zstd frames and
 * followed by a skippable zstd frame, the trailer, that holds the length
 * and the XXH3-128 digest of the stream:
 *
 *   u32 0x184D2A5C   skippable frame magic (little-endian, as all below)
 *   u32 32           size of what follows
 *   "CBXD"           trailer tag
 *   u32 1            trailer version
 *   u64 length       of the decoded stream, in bytes
 *   u8[16] digest    XXH3-128 of the decoded stream, canonical (big-endian)
 *
 * `zstd -d` skips the trailer, so a framed file is also an ordinary .zst
 * file of the stream. A zstd file without a trailer is read too, without
 * the end-to-end check.
 */

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "images-internal.h"
#include "xxhash-util.h"

#define ZSTD_FRAME_MAGIC 0xFD2FB528u
#define SKIPPABLE_MAGIC_MASK 0xFFFFFFF0u
#define SKIPPABLE_MAGIC_BASE 0x184D2A50u
#define TRAILER_MAGIC 0x184D2A5Cu
#define TRAILER_TAG "CBXD"
#define TRAILER_VERSION 1
#define TRAILER_CONTENT_LEN 32
#define INPUT_BUFFER_SIZE (128 * 1024)

static uint32_t le32(const uint8_t *p) {
        return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

static uint64_t le64(const uint8_t *p) {
        return (uint64_t) le32(p) | (uint64_t) le32(p + 4) << 32;
}

struct StreamInput {
        int fd;
        bool framed;
        bool regular;
        off_t start;            /* of a regular file: where the input began */
        uint64_t raw_total;
        uint64_t raw_bytes;

        uint8_t *in;
        size_t in_pos, in_len;
        bool in_eof;

        ZSTD_DCtx *dctx;
        uint8_t *out;
        size_t out_pos, out_len, out_cap;
        bool between_frames;

        XXH3_state_t *hash;
        uint64_t offset;

        bool has_trailer;
        uint64_t trailer_len;
        uint8_t trailer_digest[16];
};

/* Reads more input behind what is left; in_eof at the end of fd. */
static int input_fill(StreamInput *in) {
        ssize_t k;

        if (in->in_pos > 0) {
                memmove(in->in, in->in + in->in_pos, in->in_len - in->in_pos);
                in->in_len -= in->in_pos;
                in->in_pos = 0;
        }
        if (in->in_eof || in->in_len == INPUT_BUFFER_SIZE)
                return 0;
        do
                k = read(in->fd, in->in + in->in_len, INPUT_BUFFER_SIZE - in->in_len);
        while (k < 0 && errno == EINTR);
        if (k < 0)
                return -errno;
        if (k == 0)
                in->in_eof = true;
        in->in_len += (size_t) k;
        in->raw_bytes += (uint64_t) k;
        return 0;
}

/* Makes at least n bytes available unless the input ends first. */
static int input_want(StreamInput *in, size_t n) {
        int r;

        while (in->in_len - in->in_pos < n && !in->in_eof) {
                r = input_fill(in);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int input_start(StreamInput *in, ImageError *error) {
        int r;

        r = input_want(in, 4);
        if (r < 0)
                return image_error(error, r, "cannot read the stream: %s", strerror(-r));
        if (in->in_len == 0)
                return image_error(error, -ENODATA, "the input is empty: no send stream in it");
        if (in->in_len >= 4 && le32(in->in) == ZSTD_FRAME_MAGIC)
                in->framed = true;
        else if (in->in_len >= 4 && memcmp(in->in, STREAM_MAGIC, 4) == 0)
                in->framed = false;
        else
                return image_error_at(error, -EBADMSG, 0,
                                      "not a send stream: it starts neither with \"btrfs-stream\" nor "
                                      "with a zstd frame");
        in->between_frames = true;
        in->offset = 0;
        in->has_trailer = false;
        return XXH3_128bits_reset(in->hash) == XXH_OK ? 0 : -ENOMEM;
}

int stream_input_new(int fd, StreamInput **ret, ImageError *error) {
        _cleanup_(stream_input_freep) StreamInput *in = NULL;
        struct stat st;
        int r;

        in = calloc(1, sizeof *in);
        if (!in)
                return -ENOMEM;
        in->fd = fd;
        in->in = malloc(INPUT_BUFFER_SIZE);
        in->out_cap = ZSTD_DStreamOutSize();
        in->out = malloc(in->out_cap);
        in->dctx = ZSTD_createDCtx();
        in->hash = XXH3_createState();
        if (!in->in || !in->out || !in->dctx || !in->hash)
                return -ENOMEM;
        /* A file may be given at an offset (a shell's stdin after another
         * reader): the input is what follows it, also when read again. */
        if (fstat(fd, &st) >= 0 && S_ISREG(st.st_mode) && (in->start = lseek(fd, 0, SEEK_CUR)) >= 0) {
                in->regular = true;
                in->raw_total = (uint64_t) (st.st_size - MIN(in->start, st.st_size));
        }
        r = input_start(in, error);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(in);
        return 0;
}

StreamInput *stream_input_free(StreamInput *in) {
        if (!in)
                return NULL;
        free(in->in);
        free(in->out);
        ZSTD_freeDCtx(in->dctx);
        XXH3_freeState(in->hash);
        free(in);
        return NULL;
}

/* Between zstd frames: reads a skippable frame (the trailer, or another
 * one, skipped), or notes the start of the next frame. 1 if a frame
 * starts, 0 at the end of input. */
static int input_next_frame(StreamInput *in, ImageError *error) {
        for (;;) {
                uint32_t magic, size;
                int r;

                r = input_want(in, 8);
                if (r < 0)
                        return image_error(error, r, "cannot read the stream: %s", strerror(-r));
                if (in->in_len == in->in_pos)
                        return 0;
                if (in->in_len - in->in_pos < 4)
                        return image_error(error, -EBADMSG, "the input ends with %zu stray bytes after "
                                           "the last zstd frame", in->in_len - in->in_pos);
                magic = le32(in->in + in->in_pos);
                if (magic == ZSTD_FRAME_MAGIC) {
                        in->between_frames = false;
                        return 1;
                }
                if ((magic & SKIPPABLE_MAGIC_MASK) != SKIPPABLE_MAGIC_BASE || in->in_len - in->in_pos < 8)
                        return image_error(error, -EBADMSG, "bytes after a zstd frame (input offset %" PRIu64
                                           ") are neither a zstd frame nor a skippable frame",
                                           in->raw_bytes - (in->in_len - in->in_pos));
                size = le32(in->in + in->in_pos + 4);
                in->in_pos += 8;

                if (magic == TRAILER_MAGIC && size == TRAILER_CONTENT_LEN) {
                        const uint8_t *t;

                        r = input_want(in, size);
                        if (r < 0)
                                return image_error(error, r, "cannot read the stream: %s", strerror(-r));
                        if (in->in_len - in->in_pos < size)
                                return image_error(error, -EBADMSG, "the input is truncated in its digest trailer");
                        t = in->in + in->in_pos;
                        if (memcmp(t, TRAILER_TAG, 4) == 0 && le32(t + 4) == TRAILER_VERSION) {
                                in->has_trailer = true;
                                in->trailer_len = le64(t + 8);
                                memcpy(in->trailer_digest, t + 16, 16);
                        }
                        in->in_pos += size;
                        continue;
                }
                /* Someone else's skippable frame: skip it. */
                while (size > 0) {
                        size_t n;

                        r = input_want(in, 1);
                        if (r < 0)
                                return image_error(error, r, "cannot read the stream: %s", strerror(-r));
                        if (in->in_len == in->in_pos)
                                return image_error(error, -EBADMSG, "the input is truncated in a skippable frame");
                        n = MIN((size_t) size, in->in_len - in->in_pos);
                        in->in_pos += n;
                        size -= (uint32_t) n;
                }
        }
}

/* Decodes more of the current zstd frame into out. 0 at the end of input. */
static int input_decode(StreamInput *in, ImageError *error) {
        while (in->out_pos == in->out_len) {
                ZSTD_inBuffer ib;
                ZSTD_outBuffer ob = { in->out, in->out_cap, 0 };
                size_t z;
                int r;

                if (in->between_frames) {
                        r = input_next_frame(in, error);
                        if (r <= 0)
                                return r;
                }
                if (in->in_pos == in->in_len) {
                        r = input_fill(in);
                        if (r < 0)
                                return image_error(error, r, "cannot read the stream: %s", strerror(-r));
                        if (in->in_pos == in->in_len)
                                return image_error_at(error, -EBADMSG, in->offset,
                                                      "the input is truncated: it ends inside a zstd frame");
                }
                ib = (ZSTD_inBuffer) { in->in, in->in_len, in->in_pos };
                z = ZSTD_decompressStream(in->dctx, &ob, &ib);
                in->in_pos = ib.pos;
                if (ZSTD_isError(z))
                        return image_error_at(error, -EBADMSG, in->offset, "the zstd data is damaged: %s",
                                              ZSTD_getErrorName(z));
                in->out_pos = 0;
                in->out_len = ob.pos;
                if (z == 0)
                        in->between_frames = true;
        }
        return 1;
}

ssize_t stream_input_read(StreamInput *in, void *buf, size_t n, ImageError *error) {
        uint8_t *p = buf;
        size_t got = 0;
        int r;

        while (got < n) {
                size_t k;

                if (in->framed) {
                        r = input_decode(in, error);
                        if (r < 0)
                                return r;
                        if (r == 0)
                                break;
                        k = MIN(n - got, in->out_len - in->out_pos);
                        memcpy(p + got, in->out + in->out_pos, k);
                        in->out_pos += k;
                } else {
                        if (in->in_pos == in->in_len) {
                                r = input_fill(in);
                                if (r < 0)
                                        return image_error(error, r, "cannot read the stream: %s", strerror(-r));
                                if (in->in_pos == in->in_len)
                                        break;
                        }
                        k = MIN(n - got, in->in_len - in->in_pos);
                        memcpy(p + got, in->in + in->in_pos, k);
                        in->in_pos += k;
                }
                got += k;
        }
        (void) XXH3_128bits_update(in->hash, buf, got);
        in->offset += got;
        return (ssize_t) got;
}

uint64_t stream_input_offset(const StreamInput *in) {
        return in->offset;
}

uint64_t stream_input_raw_bytes(const StreamInput *in) {
        return in->raw_bytes - (in->in_len - in->in_pos);
}

uint64_t stream_input_raw_total(const StreamInput *in) {
        return in->raw_total;
}

bool stream_input_has_digest(const StreamInput *in) {
        return in->has_trailer;
}

bool stream_input_rewindable(const StreamInput *in) {
        return in->regular;
}

int stream_input_verify(StreamInput *in, ImageError *error) {
        XXH128_canonical_t actual;
        uint8_t rest;
        ssize_t k;

        /* Read through to the end, so that a trailer is seen. */
        k = stream_input_read(in, &rest, 1, error);
        if (k < 0)
                return (int) k;
        if (k > 0)
                return image_error_at(error, -EBADMSG, in->offset - 1, "unexpected bytes after the last stream");
        if (!in->framed || !in->has_trailer)
                return 0;

        XXH128_canonicalFromHash(&actual, XXH3_128bits_digest(in->hash));
        if (in->trailer_len != in->offset)
                return image_error(error, -EBADMSG, "the stream is %" PRIu64 " bytes long, but its trailer "
                                   "says %" PRIu64 ": the input is damaged or truncated",
                                   in->offset, in->trailer_len);
        if (memcmp(actual.digest, in->trailer_digest, sizeof actual.digest) != 0)
                return image_error(error, -EBADMSG, "the stream does not match the XXH3 digest in its "
                                   "trailer: the input is damaged");
        return 0;
}

int stream_input_rewind(StreamInput *in, ImageError *error) {
        if (!in->regular)
                return -ESPIPE;
        if (lseek(in->fd, in->start, SEEK_SET) < 0)
                return image_error(error, -errno, "cannot read the input again: %m");
        in->in_pos = in->in_len = 0;
        in->in_eof = false;
        in->raw_bytes = 0;
        in->out_pos = in->out_len = 0;
        ZSTD_DCtx_reset(in->dctx, ZSTD_reset_session_only);
        return input_start(in, error);
}

struct StreamOutput {
        int fd;
        bool zstd;
        ZSTD_CCtx *cctx;
        uint8_t *buf;
        size_t buf_size;
        XXH3_state_t *hash;
        uint64_t bytes_in;
        uint64_t bytes_out;
};

static int write_all(int fd, const void *buf, size_t n) {
        const uint8_t *p = buf;

        while (n > 0) {
                ssize_t k = write(fd, p, n);

                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                p += k;
                n -= (size_t) k;
        }
        return 0;
}

int stream_output_new(int fd, bool zstd, StreamOutput **ret) {
        _cleanup_(stream_output_freep) StreamOutput *out = NULL;

        out = calloc(1, sizeof *out);
        if (!out)
                return -ENOMEM;
        out->fd = fd;
        out->zstd = zstd;
        out->hash = XXH3_createState();
        if (!out->hash || XXH3_128bits_reset(out->hash) != XXH_OK)
                return -ENOMEM;
        if (zstd) {
                out->buf_size = ZSTD_CStreamOutSize();
                out->buf = malloc(out->buf_size);
                out->cctx = ZSTD_createCCtx();
                if (!out->buf || !out->cctx)
                        return -ENOMEM;
                if (ZSTD_isError(ZSTD_CCtx_setParameter(out->cctx, ZSTD_c_compressionLevel, 3)) ||
                    ZSTD_isError(ZSTD_CCtx_setParameter(out->cctx, ZSTD_c_checksumFlag, 1)))
                        return -EINVAL;
        }
        *ret = TAKE_PTR(out);
        return 0;
}

StreamOutput *stream_output_free(StreamOutput *out) {
        if (!out)
                return NULL;
        ZSTD_freeCCtx(out->cctx);
        free(out->buf);
        XXH3_freeState(out->hash);
        free(out);
        return NULL;
}

static int output_compress(StreamOutput *out, const void *p, size_t n, ZSTD_EndDirective mode) {
        ZSTD_inBuffer ib = { p, n, 0 };

        for (;;) {
                ZSTD_outBuffer ob = { out->buf, out->buf_size, 0 };
                size_t left = ZSTD_compressStream2(out->cctx, &ob, &ib, mode);
                int r;

                if (ZSTD_isError(left))
                        return -EIO;
                r = write_all(out->fd, out->buf, ob.pos);
                if (r < 0)
                        return r;
                out->bytes_out += ob.pos;
                if (mode == ZSTD_e_end ? left == 0 : ib.pos == ib.size)
                        return 0;
        }
}

int stream_output_write(StreamOutput *out, const void *buf, size_t n) {
        int r;

        (void) XXH3_128bits_update(out->hash, buf, n);
        out->bytes_in += n;
        if (out->zstd)
                return output_compress(out, buf, n, ZSTD_e_continue);
        r = write_all(out->fd, buf, n);
        if (r >= 0)
                out->bytes_out += n;
        return r;
}

static void put_le32(uint8_t *p, uint32_t v) {
        for (unsigned i = 0; i < 4; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

int stream_output_finish(StreamOutput *out) {
        uint8_t trailer[8 + TRAILER_CONTENT_LEN];
        XXH128_canonical_t digest;
        int r;

        if (!out->zstd)
                return 0;
        r = output_compress(out, NULL, 0, ZSTD_e_end);
        if (r < 0)
                return r;

        XXH128_canonicalFromHash(&digest, XXH3_128bits_digest(out->hash));
        put_le32(trailer, TRAILER_MAGIC);
        put_le32(trailer + 4, TRAILER_CONTENT_LEN);
        memcpy(trailer + 8, TRAILER_TAG, 4);
        put_le32(trailer + 12, TRAILER_VERSION);
        put_le32(trailer + 16, (uint32_t) out->bytes_in);
        put_le32(trailer + 20, (uint32_t) (out->bytes_in >> 32));
        memcpy(trailer + 24, digest.digest, 16);
        r = write_all(out->fd, trailer, sizeof trailer);
        if (r >= 0)
                out->bytes_out += sizeof trailer;
        return r;
}

uint64_t stream_output_bytes(const StreamOutput *out) {
        return out->bytes_out;
}
