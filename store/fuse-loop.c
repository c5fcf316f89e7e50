/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The request loop of the FUSE front end.
 *
 * At most one thread waits on the device for the next request, and the
 * thread that received a request serves it, then waits for the next one
 * itself. Only a request that may take long (it reads or writes much data,
 * or waits for the disk) makes its thread call another one to the device
 * first, so that requests of other programs go on meanwhile: the blocks of
 * a large file's read-ahead are decompressed in parallel that way.
 *
 * Why not libfuse's multi-threaded loop: it keeps every idle thread waiting
 * on the device, and the kernel gives each request to the thread that has
 * waited longest, so the requests of one program, one after another, each
 * wake another thread, and waking a thread is most of what a request
 * costs. rm -rf and cp -r of thousands of small files took 10 to 20% longer
 * on two threads than on one. Serving requests that do not take long one
 * at a time loses nothing: they hold the volume's lock throughout anyway.
 */

#define FUSE_USE_VERSION 314

#include <errno.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "cleanup.h"
#include "fuse-loop.h"

/* A READ or WRITE of at least this much is worth a second thread. */
#define LONG_IO_BYTES (128u * 1024u)

typedef struct Dispatcher Dispatcher;

typedef struct Worker {
        Dispatcher *dispatcher;
        pthread_t thread;
        struct fuse_buf buf;
} Worker;

struct Dispatcher {
        struct fuse_session *se;
        pthread_mutex_t lock;
        pthread_cond_t turn;    /* nobody waits on the device any more */
        sem_t stopped;          /* a worker saw the session end */
        Worker *workers;
        unsigned n_workers, max_workers;
        unsigned waiting;       /* workers waiting for their turn at the device */
        bool receiving;         /* a worker waits on the device */
        bool stopping;
        int error;
};

static uint32_t request_opcode(const struct fuse_buf *buf) {
        const struct fuse_in_header *in = buf->mem;

        return buf->size >= sizeof *in ? in->opcode : 0;
}

static bool request_may_take_long(const struct fuse_buf *buf) {
        const struct fuse_in_header *in = buf->mem;

        switch (request_opcode(buf)) {
        case FUSE_READ:
                /* Even a small READ may wait for the disk: every READ that
                 * reaches us missed the page cache. */
                return true;
        case FUSE_WRITE:
                return in->len >= sizeof *in + sizeof(struct fuse_write_in) + LONG_IO_BYTES;
        case FUSE_FSYNC:
        case FUSE_FSYNCDIR:
        case FUSE_FALLOCATE:
        case FUSE_COPY_FILE_RANGE:
        case FUSE_LSEEK:
                return true;
        default:
                return false;
        }
}

static void *worker_main(void *userdata);

/* Called with the lock held. */
static int worker_start(Dispatcher *d) {
        Worker *w = &d->workers[d->n_workers];
        sigset_t block, saved;
        int r;

        /* libfuse's handlers of these end the session: they belong to the
         * thread that waits for that, never to one blocked on the device. */
        sigemptyset(&block);
        sigaddset(&block, SIGHUP);
        sigaddset(&block, SIGINT);
        sigaddset(&block, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &block, &saved);
        *w = (Worker) { .dispatcher = d };
        r = -pthread_create(&w->thread, NULL, worker_main, w);
        pthread_sigmask(SIG_SETMASK, &saved, NULL);
        if (r < 0)
                return r;
        d->n_workers++;
        return 0;
}

/* Another worker waits on the device while this one serves a long request.
 * Called with the lock held. Without one to spare, requests wait for the
 * first worker that is free. */
static void hand_off(Dispatcher *d) {
        if (d->stopping)
                return;
        if (d->waiting > 0)
                pthread_cond_signal(&d->turn);
        else if (d->n_workers < d->max_workers)
                (void) worker_start(d);
}

/* The dispatcher of the request this thread serves, and whether another
 * worker was called to the device for it already. */
static __thread Dispatcher *serving;
static __thread bool handed_off;

void session_hand_off(void) {
        Dispatcher *d = serving;

        if (!d || handed_off)
                return;
        pthread_mutex_lock(&d->lock);
        hand_off(d);
        pthread_mutex_unlock(&d->lock);
        handed_off = true;
}

/* Called with the lock held. */
static void stop(Dispatcher *d, int error) {
        if (error < 0 && d->error == 0)
                d->error = error;
        if (!d->stopping) {
                d->stopping = true;
                pthread_cond_broadcast(&d->turn);
                sem_post(&d->stopped);
        }
}

static void *worker_main(void *userdata) {
        Worker *w = userdata;
        Dispatcher *d = w->dispatcher;

        /* Cancelled only while it waits on the device (see session_serve()). */
        pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);

        pthread_mutex_lock(&d->lock);
        for (;;) {
                bool init;
                int r;

                while (d->receiving && !d->stopping) {
                        d->waiting++;
                        pthread_cond_wait(&d->turn, &d->lock);
                        d->waiting--;
                }
                if (d->stopping)
                        break;
                if (fuse_session_exited(d->se)) {      /* a signal */
                        stop(d, 0);
                        break;
                }
                d->receiving = true;
                pthread_mutex_unlock(&d->lock);

                pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
                r = fuse_session_receive_buf(d->se, &w->buf);
                pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);

                pthread_mutex_lock(&d->lock);
                d->receiving = false;
                if (r == -EINTR)
                        continue;
                if (r <= 0) {   /* 0: unmounted */
                        stop(d, r);
                        break;
                }
                handed_off = request_may_take_long(&w->buf);
                if (handed_off)
                        hand_off(d);
                init = request_opcode(&w->buf) == FUSE_INIT;
                pthread_mutex_unlock(&d->lock);

                serving = d;
                fuse_session_process_buf(d->se, &w->buf);
                serving = NULL;

                pthread_mutex_lock(&d->lock);
                /* libfuse ends the session when it cannot agree with the
                 * kernel, and says why on stderr. */
                if (init && fuse_session_exited(d->se)) {
                        stop(d, -EPROTO);
                        break;
                }
        }
        pthread_cond_signal(&d->turn);
        pthread_mutex_unlock(&d->lock);
        return NULL;
}

int session_serve(struct fuse_session *se, unsigned max_threads) {
        Dispatcher d = {
                .se = se,
                .lock = PTHREAD_MUTEX_INITIALIZER,
                .turn = PTHREAD_COND_INITIALIZER,
                .max_workers = MAX(max_threads, 1u),
        };
        int r;

        d.workers = calloc(d.max_workers, sizeof *d.workers);
        if (!d.workers)
                return -ENOMEM;
        if (sem_init(&d.stopped, 0, 0) < 0) {
                free(d.workers);
                return -errno;
        }

        pthread_mutex_lock(&d.lock);
        r = worker_start(&d);
        pthread_mutex_unlock(&d.lock);

        /* An unmount ends the session through a worker; a signal through
         * libfuse's handler and this wait, which it interrupts: the workers
         * block the signals, and the kernel gives a signal to the main
         * thread first. One that comes between the check and the wait is
         * seen by the next request, as in libfuse's own loop. */
        while (r >= 0 && !fuse_session_exited(se))
                if (sem_wait(&d.stopped) == 0)
                        break;

        pthread_mutex_lock(&d.lock);
        stop(&d, 0);
        /* The one worker that may wait on the device would wait for ever. */
        for (unsigned i = 0; i < d.n_workers; i++)
                pthread_cancel(d.workers[i].thread);
        pthread_mutex_unlock(&d.lock);

        for (unsigned i = 0; i < d.n_workers; i++) {
                pthread_join(d.workers[i].thread, NULL);
                free(d.workers[i].buf.mem);
        }
        free(d.workers);
        sem_destroy(&d.stopped);
        pthread_cond_destroy(&d.turn);
        pthread_mutex_destroy(&d.lock);
        if (r < 0)
                return r;
        /* libfuse said why on stderr; its errno is not ours to pass on
         * (-EPROTO from an INIT the kernel refused would read as a store of
         * a newer format). */
        return d.error < 0 ? -EIO : 0;
}
