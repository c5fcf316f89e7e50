/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The request loop of the FUSE front end; used by fuse.c only. */

struct fuse_session;

/* Serves the session's requests on up to max_threads threads until the
 * file system is unmounted or a signal handler of libfuse's ends the
 * session; to see those signals at once, call it on the main thread.
 * Returns 0 then, -EIO if the session failed, or a negative errno if no
 * thread could be started. */
int session_serve(struct fuse_session *se, unsigned max_threads);

/* Called while a request is served, before it waits: another thread reads
 * the device meanwhile (once per request; nothing outside a request). */
void session_hand_off(void);
