#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""A subvolume's quota: writes that would pass the limit fail with EDQUOT
at write() (every write() reaches the server before it returns, so no
error waits for close() to turn into EIO), what write() accepted is what
is stored, everything written and fsync'd before stays intact, removing files makes room, a raised limit
applies to the mounted subvolume within seconds, and snapshots keep the
limit of their source. A file unlinked while open counts until it is
closed."""

import errno
import os
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB, MiB  # noqa: E402


def write_synced(path, data):
    """Writes and fsyncs; returns None or the errno that stopped it."""
    try:
        t.write_file(path, data, fsync=True)
    except OSError as e:
        return e.errno
    return None


def write_synced_within(path, data, seconds):
    """Writes and fsyncs again and again until it works or seconds pass;
    returns None or the last errno."""
    deadline = time.monotonic() + seconds
    while True:
        err = write_synced(path, data)
        if err is None or time.monotonic() > deadline:
            return err
        time.sleep(0.1)


def write_buffered(path, chunk, count):
    """Writes count chunks without fsync; returns (bytes accepted, errno of
    the write that stopped, errno of close)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written, write_err, close_err = 0, None, None
    try:
        for i in range(count):
            written += os.write(fd, chunk)
    except OSError as e:
        write_err = e.errno
    try:
        os.close(fd)
    except OSError as e:
        close_err = e.errno
    return written, write_err, close_err


def check_forget_after_write(store):
    """The kernel may tell the server that it forgot a removed file after
    a write that needs the file's room has arrived: the write waits for it
    a moment rather than fail, large (served beside the device's reader)
    or small (served by it). Here the kernel forgets the file when an
    O_PATH descriptor of it (which opens nothing) is closed, while the
    write waits."""
    for label, kept, size in (('large', 1536 * KiB, 1 * MiB), ('small', 2 * MiB - 64 * KiB, 96 * KiB)):
        name = f'late-{label}'
        store.create(name)
        store.run('subvolume', 'set-quota', name, '2M')
        with store.mount(name) as m:
            t.check_equal(write_synced(m.p('first'), t.random_bytes(kept, 10)), None,
                          f'{label}: writing {kept} bytes under a 2 MiB quota')
            holder = os.open(m.p('first'), os.O_PATH)
            result = {}
            try:
                os.unlink(m.p('first'))
                writer = threading.Thread(target=lambda: result.update(err=write_synced(
                    m.p('second'), t.random_bytes(size, 11))))
                writer.start()
                time.sleep(0.2)
                t.check(writer.is_alive(), f'{label}: the write that needs the room of a file not yet forgotten '
                        f'did not wait: {result}')
            finally:
                os.close(holder)
            writer.join(30)
            t.check_equal(result.get('err', 'still running'), None,
                          f'{label}: writing {size} bytes when the removed file was forgotten during the write')


def check_sizes_past_63_bits(store):
    """Sparse files whose sizes add up past 2^63 - 1 bytes, what the
    store's counts hold (each file may be that large): the count stops
    there rather than wrap to a few bytes, or below zero in JSON, and a
    quota still refuses what passes it."""
    store.create('sparse')
    with store.mount('sparse') as m:
        for name in ('a', 'b', 'c'):
            with open(m.p(name), 'wb') as f:
                f.truncate(2**62)
    t.check_equal(store.show('sparse')['logical_bytes'], 2**63 - 1, 'the logical bytes of sparse files past 2^63')
    doc = store.json('subvolume', 'list')
    t.check(all(s['logical_bytes'] >= 0 for s in t.json_subvolume_list(doc)), f'the listing: {doc}')
    store.run('subvolume', 'set-quota', 'sparse', '1G')
    with store.mount('sparse') as m:
        with open(m.p('d'), 'wb') as f:
            try:
                f.truncate(1)
                err = None
            except OSError as e:
                err = e.errno
        t.check_equal(err, errno.EDQUOT, 'a growth under a quota the files passed long ago')
    store.run('subvolume', 'delete', 'sparse')


def run():
    t.require_fuse()
    with t.Store('quota') as store:
        store.create('ws')
        store.run('subvolume', 'set-quota', 'ws', '2M')
        t.check_equal(store.show('ws')['quota_bytes'], 2 * MiB, 'quota_bytes after set-quota 2M')

        first = t.random_bytes(1536 * KiB, 1)
        with store.mount('ws') as m:
            t.check_equal(write_synced(m.p('first'), first), None, 'writing 1.5 MiB under a 2 MiB quota')
            err = write_synced(m.p('second'), t.random_bytes(1 * MiB, 2))
            t.check_equal(err, errno.EDQUOT, 'writing 1 MiB more: the error')
            t.check_bytes(t.read_file(m.p('first')), first, 'the file written before the quota was reached')
            # df shows the limit and what is left of it, as with project
            # quotas: a program that asks before it writes is not told of
            # room that its write would be refused.
            st = os.statvfs(m.path)
            t.check_equal(st.f_blocks * st.f_frsize, 2 * MiB, 'statfs size of a subvolume with a 2 MiB quota')
            t.check(0 < st.f_bavail * st.f_frsize <= 512 * KiB and st.f_bavail <= st.f_bfree <= st.f_blocks,
                    f'statfs with 1.5 MiB of a 2 MiB quota used: {st.f_bavail} blocks available, '
                    f'{st.f_bfree} free of {st.f_blocks}, of {st.f_frsize} bytes')
            # Small files still fit, up to the limit.
            t.check_equal(write_synced(m.p('small'), b'x' * 1000), None, 'a small file under the limit')
            # A file made larger by its size alone counts as if written.
            t.expect_errno(errno.EDQUOT, os.truncate, m.p('small'), 100 * 1024 * MiB,
                           what='truncate to 100 GiB past the limit')
            with open(m.p('small'), 'r+b') as f:
                t.expect_errno(errno.EDQUOT, os.ftruncate, f.fileno(), 1 * MiB, what='ftruncate past the limit')
                os.ftruncate(f.fileno(), 2000)
            t.check_equal(os.stat(m.p('small')).st_size, 2000, 'a file made larger under the limit')

            # Buffered writes past the limit, no fsync: the write() that
            # passes it fails, close() does not, and the file holds exactly
            # what was accepted, also after a remount.
            chunk = t.random_bytes(128 * KiB, 6)
            written, write_err, close_err = write_buffered(m.p('buffered'), chunk, 16)
            t.check_equal((write_err, close_err), (errno.EDQUOT, None),
                          'errors of buffered 128 KiB writes past the limit (write, close)')
            t.check(0 < written < 16 * len(chunk), f'{written} bytes accepted of {16 * len(chunk)}')
            t.check_equal(os.stat(m.p('buffered')).st_size, written, 'size of the file written past the limit')
            st = os.statvfs(m.path)
            t.check(st.f_bavail * st.f_frsize < len(chunk) and st.f_favail > 0,
                    f'statfs once a write of {len(chunk)} bytes met the quota: {st.f_bavail} blocks and '
                    f'{st.f_favail} inodes available (the quota counts bytes, not files)')
        with store.mount('ws') as m:
            t.check_bytes(t.read_file(m.p('buffered')), (chunk * 16)[:written],
                          'the file written past the limit, after a remount')
            os.unlink(m.p('buffered'))

            # Room comes back when files go.
            os.unlink(m.p('second'))
            os.unlink(m.p('first'))
            t.check_equal(write_synced(m.p('third'), t.random_bytes(1 * MiB, 3)), None,
                          'writing 1 MiB after removing files')

            # A raised limit reaches the mounted subvolume.
            store.run('subvolume', 'set-quota', 'ws', '8M')
            err = write_synced_within(m.p('big'), t.random_bytes(4 * MiB, 4), 10)
            t.check_equal(err, None, 'writing 4 MiB within 10 s of raising the quota to 8 MiB')
            # A lowered limit holds from the next write on: set-quota tells
            # the server, which would otherwise read it at its next commit,
            # up to a second later.
            store.run('subvolume', 'set-quota', 'ws', '6M')
            err = write_synced(m.p('over'), t.random_bytes(2 * MiB, 10))
            t.check_equal(err, errno.EDQUOT, 'writing 2 MiB straight after lowering the quota to 6 MiB: the error')
            store.run('subvolume', 'set-quota', 'ws', '8M')
            os.unlink(m.p('over'))
        with store.mount('ws') as m:
            t.check_bytes(t.read_file(m.p('big')), t.random_bytes(4 * MiB, 4), 'the file written after the raise')

        store.snapshot('ws', 'ws-snap')
        t.check_equal(store.show('ws-snap')['quota_bytes'], 8 * MiB, 'quota of a snapshot')
        store.run('subvolume', 'set-quota', 'ws', 'none')
        t.check_equal(store.show('ws')['quota_bytes'], 0, 'quota_bytes after set-quota none')
        with store.mount('ws') as m:
            t.check_equal(write_synced(m.p('huge'), t.random_bytes(12 * MiB, 5)), None, 'writing with no quota')
        # A file unlinked while open keeps its room until it is closed, as
        # on a local file system: its own writes meet the limit too.
        store.create('held')
        store.run('subvolume', 'set-quota', 'held', '2M')
        with store.mount('held') as m:
            t.check_equal(write_synced(m.p('f'), t.random_bytes(1536 * KiB, 7)), None,
                          'writing 1.5 MiB under a 2 MiB quota')
            fd = os.open(m.p('f'), os.O_RDWR)
            try:
                os.unlink(m.p('f'))
                t.check_equal(write_synced(m.p('g'), t.random_bytes(1 * MiB, 8)), errno.EDQUOT,
                              'writing 1 MiB while 1.5 MiB are unlinked but open: the error')
                t.expect_errno(errno.EDQUOT, os.pwrite, fd, t.random_bytes(1 * MiB, 9), 1536 * KiB,
                               what='extending a file unlinked while open past the limit')
            finally:
                os.close(fd)
            # The kernel tells the server it forgot the file after close().
            err = write_synced_within(m.p('g'), t.random_bytes(1 * MiB, 8), 10)
            t.check_equal(err, None, 'writing 1 MiB within 10 s of closing the unlinked file')
        info = store.show('held')
        t.check_equal((info['inodes'], info['logical_bytes']), (2, 1 * MiB), 'held: inodes and logical bytes')
        check_forget_after_write(store)
        check_sizes_past_63_bits(store)

        r = store.run('subvolume', 'set-quota', 'missing', '1M', expect=1)
        t.check('missing' in r.err, f'set-quota of a missing subvolume names it:\n{r.describe()}')
        store.run('subvolume', 'set-quota', 'ws', 'lots', expect=2)


t.main(run)
