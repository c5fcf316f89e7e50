/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The control socket of a writable server. The process that has a
 * subvolume mounted writable owns its top layer, so a snapshot of it must
 * be taken by that process: another process asks over this socket, and the
 * server commits and freezes its top layer at a point where everything
 * written before the request is in the snapshot.
 *
 * The socket is abstract (no file to go stale after a crash), named after
 * the store's UUID and the subvolume's id; only root and the server's own
 * user may ask.
 *
 * Request: "snapshot <0|1 read-only> <name>\n". Reply: "<errno or 0>\n".
 */

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "store-internal.h"

#define REQUEST_MAX (STORE_NAME_MAX + 32)

struct ControlServer {
        struct Volume *volume;
        int listen_fd;
        int stop_fd;
        pthread_t thread;
};

static socklen_t control_address(Store *s, uint64_t subvolume_id, struct sockaddr_un *ret) {
        int n;

        *ret = (struct sockaddr_un) { .sun_family = AF_UNIX };
        n = snprintf(ret->sun_path + 1, sizeof ret->sun_path - 1, "cowbox/%s/%" PRIu64, s->uuid, subvolume_id);
        return (socklen_t) (offsetof(struct sockaddr_un, sun_path) + 1 + (size_t) n);
}

static bool peer_is_trusted(int fd) {
        struct ucred cred;
        socklen_t len = sizeof cred;

        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
                return false;
        return cred.uid == 0 || cred.uid == geteuid();
}

static int read_line(int fd, char *buf, size_t size) {
        size_t n = 0;

        while (n < size - 1) {
                ssize_t k = read(fd, buf + n, size - 1 - n);

                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (k == 0)
                        break;
                n += (size_t) k;
                if (memchr(buf, '\n', n))
                        break;
        }
        buf[n] = 0;
        if (!strchr(buf, '\n'))
                return -EBADMSG;
        *strchr(buf, '\n') = 0;
        return 0;
}

static int handle_request(ControlServer *c, int fd) {
        char buf[REQUEST_MAX + 1];
        const char *name;
        int r;

        if (!peer_is_trusted(fd))
                return -EPERM;
        r = read_line(fd, buf, sizeof buf);
        if (r < 0)
                return r;
        if (strncmp(buf, "snapshot ", 9) != 0 || (buf[9] != '0' && buf[9] != '1') || buf[10] != ' ')
                return -EBADMSG;
        name = buf + 11;
        if (!store_name_is_valid(name))
                return -EINVAL;
        return volume_take_snapshot(c->volume, name, buf[9] == '1');
}

static void *control_main(void *userdata) {
        ControlServer *c = userdata;

        for (;;) {
                struct pollfd p[2] = {
                        { .fd = c->listen_fd, .events = POLLIN },
                        { .fd = c->stop_fd, .events = POLLIN },
                };
                _cleanup_close_ int fd = -EBADF;
                char reply[16];
                int r, n;

                if (poll(p, 2, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        break;
                }
                if (p[1].revents)
                        break;
                fd = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC);
                if (fd < 0)
                        continue;
                r = handle_request(c, fd);
                n = snprintf(reply, sizeof reply, "%d\n", r < 0 ? -r : 0);
                (void) !write(fd, reply, (size_t) n);
        }
        return NULL;
}

int control_server_start(struct Volume *v, Store *s, uint64_t subvolume_id, ControlServer **ret) {
        struct sockaddr_un sa;
        socklen_t len = control_address(s, subvolume_id, &sa);
        ControlServer *c;
        int r;

        c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->volume = v;
        c->stop_fd = eventfd(0, EFD_CLOEXEC);
        c->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (c->stop_fd < 0 || c->listen_fd < 0) {
                r = -errno;
                goto fail;
        }
        /* We hold the subvolume's exclusive lock, so a stale name cannot
         * exist: abstract names vanish with their process. */
        if (bind(c->listen_fd, (struct sockaddr *) &sa, len) < 0 || listen(c->listen_fd, 16) < 0) {
                r = -errno;
                goto fail;
        }
        r = -pthread_create(&c->thread, NULL, control_main, c);
        if (r < 0)
                goto fail;
        *ret = c;
        return 0;
fail:
        safe_close(c->listen_fd);
        safe_close(c->stop_fd);
        free(c);
        return r;
}

ControlServer *control_server_stop(ControlServer *c) {
        uint64_t one = 1;

        if (!c)
                return NULL;
        (void) !write(c->stop_fd, &one, sizeof one);
        pthread_join(c->thread, NULL);
        safe_close(c->listen_fd);
        safe_close(c->stop_fd);
        free(c);
        return NULL;
}

int control_request_snapshot(Store *s, uint64_t subvolume_id, const char *name, bool readonly) {
        _cleanup_close_ int fd = -EBADF;
        struct sockaddr_un sa;
        socklen_t len = control_address(s, subvolume_id, &sa);
        char buf[REQUEST_MAX + 1];
        int n, r, value;

        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        /* Held by a process that serves no control socket (a read-only
         * server, a delete in progress): the subvolume is busy. */
        if (connect(fd, (struct sockaddr *) &sa, len) < 0)
                return errno == ECONNREFUSED || errno == ENOENT ? -EBUSY : -errno;

        n = snprintf(buf, sizeof buf, "snapshot %d %s\n", readonly ? 1 : 0, name);
        if (write(fd, buf, (size_t) n) != n)
                return -EIO;
        r = read_line(fd, buf, sizeof buf);
        if (r < 0)
                return r == -EBADMSG ? -EIO : r;
        if (sscanf(buf, "%d", &value) != 1 || value < 0)
                return -EIO;
        return -value;
}
