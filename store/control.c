/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The control socket of a writable server. The process that has a
 * subvolume mounted writable owns its top layer, so a snapshot of it must
 * be taken by that process: another process asks over this socket, and the
 * server commits and freezes its top layer at a point where everything
 * written before the request is in the snapshot.
 *
 * The socket is abstract (no file to go stale after a crash), named after
 * the store's UUID and the subvolume's id. Anyone in the network namespace
 * can connect, a sandbox's task with the host's network too: a request
 * must come from root or the server's own user, and with a descriptor of
 * the store's directory, which only those who may open the store have
 * (a sandbox's task never sees it).
 *
 * Requests: "snapshot-as <0|1 read-only> <uuid> <name>\n", and "quota\n"
 * (read the quota again), the store's directory passed with its first
 * byte. Reply: "<errno or 0>\n". Servers also take "snapshot <0|1>
 * <name>\n", the request of clients from before the UUID was sent.
 */

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "store-internal.h"

#define REQUEST_MAX (STORE_NAME_MAX + 64)
/* A peer that connects and says nothing must not stop the server's
 * snapshots for long. */
#define REQUEST_TIMEOUT_SEC 5

struct ControlServer {
        struct Volume *volume;
        int store_fd;
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

/* Receives the first byte of the request and the descriptor that comes
 * with it: it must be of the store's directory. */
static int receive_store_proof(ControlServer *c, int fd, char *ret_first) {
        union {
                struct cmsghdr header;
                char buf[CMSG_SPACE(sizeof(int))];
        } control = {};
        struct iovec iov = { .iov_base = ret_first, .iov_len = 1 };
        struct msghdr msg = {
                .msg_iov = &iov,
                .msg_iovlen = 1,
                .msg_control = &control,
                .msg_controllen = sizeof control,
        };
        struct cmsghdr *cmsg;
        struct stat mine, theirs;
        _cleanup_close_ int passed = -EBADF;
        ssize_t n;

        do
                n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return -errno;
        cmsg = CMSG_FIRSTHDR(&msg);
        if (cmsg && cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS &&
            cmsg->cmsg_len == CMSG_LEN(sizeof(int)))
                memcpy(&passed, CMSG_DATA(cmsg), sizeof(int));
        if (n != 1 || passed < 0 || (msg.msg_flags & MSG_CTRUNC))
                return -EPERM;
        if (fstat(passed, &theirs) < 0 || fstat(c->store_fd, &mine) < 0 || theirs.st_dev != mine.st_dev ||
            theirs.st_ino != mine.st_ino)
                return -EPERM;
        return 0;
}

static int parse_and_take_snapshot(ControlServer *c, char *request, char uuid[static 37]) {
        const char *flag, *name;
        int r;

        if (startswith(request, "snapshot-as ")) {
                flag = request + strlen("snapshot-as ");
                if (!flag[0] || flag[1] != ' ' || strlen(flag + 2) < 38 || flag[2 + 36] != ' ')
                        return -EBADMSG;
                memcpy(uuid, flag + 2, 36);
                uuid[36] = 0;
                name = flag + 2 + 37;
        } else if (startswith(request, "snapshot ")) {
                flag = request + strlen("snapshot ");
                if (!flag[0] || flag[1] != ' ')
                        return -EBADMSG;
                r = store_uuid_new(uuid);
                if (r < 0)
                        return r;
                name = flag + 2;
        } else
                return -EBADMSG;
        if (flag[0] != '0' && flag[0] != '1')
                return -EBADMSG;
        if (!store_name_is_valid(name) || !uuid_string_is_valid(uuid))
                return -EINVAL;
        return volume_take_snapshot(c->volume, name, flag[0] == '1', uuid);
}

static int handle_request(ControlServer *c, int fd) {
        struct timeval timeout = { .tv_sec = REQUEST_TIMEOUT_SEC };
        char buf[REQUEST_MAX + 1];
        char uuid[37];
        int r;

        if (!peer_is_trusted(fd))
                return -EPERM;
        (void) setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
        r = receive_store_proof(c, fd, buf);
        if (r < 0)
                return r;
        r = read_line(fd, buf + 1, sizeof buf - 1);
        if (r < 0)
                return r;
        if (streq(buf, "quota")) {
                volume_quota_refresh(c->volume);
                return 0;
        }
        return parse_and_take_snapshot(c, buf, uuid);
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
        c->store_fd = s->dir_fd;
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

/* Sends the request, with the store's directory passed with its first byte
 * and the rest after. */
static int send_with_store(Store *s, int fd, const char *text, size_t size) {
        union {
                struct cmsghdr header;
                char buf[CMSG_SPACE(sizeof(int))];
        } control = {};
        struct iovec iov = { .iov_base = (void *) text, .iov_len = 1 };
        struct msghdr msg = {
                .msg_iov = &iov,
                .msg_iovlen = 1,
                .msg_control = &control,
                .msg_controllen = sizeof control,
        };
        struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);

        cmsg->cmsg_level = SOL_SOCKET;
        cmsg->cmsg_type = SCM_RIGHTS;
        cmsg->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cmsg), &s->dir_fd, sizeof(int));
        if (sendmsg(fd, &msg, MSG_NOSIGNAL) != 1)
                return -EIO;
        if (send(fd, text + 1, size - 1, MSG_NOSIGNAL) != (ssize_t) (size - 1))
                return -EIO;
        return 0;
}

/* Sends a request to the server of the subvolume; -ECONNREFUSED if
 * nobody serves its control socket. Waits for the answer at most
 * timeout_sec seconds, or for ever with 0. */
static int control_request(Store *s, uint64_t subvolume_id, const char *text, unsigned timeout_sec) {
        struct timeval timeout = { .tv_sec = timeout_sec };
        _cleanup_close_ int fd = -EBADF;
        struct sockaddr_un sa;
        socklen_t len = control_address(s, subvolume_id, &sa);
        char buf[REQUEST_MAX + 1];
        int r, value;

        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        if (connect(fd, (struct sockaddr *) &sa, len) < 0)
                return errno == ENOENT ? -ECONNREFUSED : -errno;
        if (timeout_sec > 0)
                (void) setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);

        r = send_with_store(s, fd, text, strlen(text));
        if (r < 0)
                return r;
        r = read_line(fd, buf, sizeof buf);
        if (r < 0)
                return r == -EBADMSG ? -EIO : r;
        if (sscanf(buf, "%d", &value) != 1 || value < 0)
                return -EIO;
        return -value;
}

int control_request_snapshot(Store *s, uint64_t subvolume_id, const char *name, bool readonly, const char *uuid) {
        char buf[REQUEST_MAX + 1];

        snprintf(buf, sizeof buf, "snapshot-as %d %s %s\n", readonly ? 1 : 0, uuid, name);
        return control_request(s, subvolume_id, buf, 0);
}

/* A server that does not answer soon reads the quota at its next commit
 * anyway: the caller (cowboxd) need not wait for it. */
#define QUOTA_REQUEST_TIMEOUT_SEC 2

int control_request_quota(Store *s, uint64_t subvolume_id) {
        int r = control_request(s, subvolume_id, "quota\n", QUOTA_REQUEST_TIMEOUT_SEC);

        return r == -ECONNREFUSED ? 0 : r; /* not mounted writable: nobody to tell */
}
