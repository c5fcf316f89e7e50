#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""fsync means durable: data fsync'd before the FUSE server is killed with
SIGKILL is all there after a remount and in a snapshot taken before it, the
store opens and fsck finds it clean, and data not fsync'd is either there or
not, never garbage.

  COWBOX_CRASH_CYCLES=N    kill-and-remount cycles (default 4)
"""

import errno
import os
import signal
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB, MiB  # noqa: E402

J = os.path.join
PAGE = 4096


def sizes(cycle):
    # Inline (small), one block, several blocks, and compressible.
    return [100, 1500, 70 * KiB, 300 * KiB + 123, 1 * MiB + cycle]


def content(cycle, i, size):
    if i % 2:
        return t.pattern_bytes(size, cycle * 100 + i)
    return t.random_bytes(size, cycle * 100 + i)


def check_pages(got, options, what):
    """Each page of got equals the same page of one of options, or zeros
    (data that did not reach the store before the crash)."""
    longest = max(len(o) for o in options)
    t.check(len(got) <= longest, f'{what}: {len(got)} bytes, more than was ever written ({longest})')
    for off in range(0, len(got), PAGE):
        page = got[off:off + PAGE]
        if page == bytes(len(page)):
            continue
        if not any(o[off:off + len(page)] == page for o in options):
            t.fail(f'{what}: the page at {off} is neither what was written nor zeros')


def cycle_writes(m, cycle, durable, maybe):
    """Writes fsync'd files (recorded in durable) and unsynced ones (recorded
    in maybe: path -> the contents it may have)."""
    d = m.p(f'cycle-{cycle}')
    os.mkdir(d)
    for i, size in enumerate(sizes(cycle)):
        data = content(cycle, i, size)
        t.write_file(J(d, f'synced-{i}'), data, fsync=True)
        durable[f'cycle-{cycle}/synced-{i}'] = data
    t.fsync_dir(d)
    t.fsync_dir(m.path)

    # Rewrite a file synced in an earlier cycle, with fsync.
    if cycle > 0:
        rel = f'cycle-{cycle - 1}/synced-3'
        old = durable[rel]
        new = old[:1000] + b'rewritten in cycle %d' % cycle + old[1000 + 20:]
        new = new[:len(old)]
        with open(m.p(rel), 'r+b') as f:
            f.write(new)
            os.fsync(f.fileno())
        durable[rel] = new

    # A file synced, then unlinked while still open at the crash.
    fd = os.open(J(d, 'orphan'), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    os.write(fd, t.random_bytes(200 * KiB, cycle))
    os.fsync(fd)
    os.unlink(J(d, 'orphan'))

    # Not synced: new files, and a change to a synced file.
    for i in range(3):
        data = t.random_bytes(150 * KiB + i, 1000 + cycle * 10 + i)
        t.write_file(J(d, f'unsynced-{i}'), data)
        maybe[f'cycle-{cycle}/unsynced-{i}'] = [data]
    rel = f'cycle-{cycle}/synced-4'
    changed = bytearray(durable[rel])
    changed[5000:5000 + 100 * KiB] = t.random_bytes(100 * KiB, 2000 + cycle)
    with open(J(d, 'synced-4'), 'r+b') as f:
        f.write(changed)
    maybe[rel] = [durable.pop(rel), bytes(changed)]
    return fd


def crash(store, m, cycle, busy):
    """Kills the server while (if busy) a thread keeps writing, then takes
    read-only snapshot after-crash-CYCLE of the subvolume."""
    info = store.show('crash')
    t.check_equal(info['mounted_by'], m.pid, 'mounted_by names the server')
    stop = threading.Event()
    errors = []

    def writer():
        i = 0
        while not stop.is_set():
            try:
                t.write_file(m.p(f'cycle-{cycle}', f'busy-{i % 8}'), t.random_bytes(200 * KiB, i))
            except OSError as e:
                errors.append(e.errno)
                return
            i += 1

    th = threading.Thread(target=writer) if busy else None
    if th:
        th.start()
        time.sleep(0.3)
    m.kill()
    if th:
        stop.set()
        th.join()
        t.check(all(e in (errno.ENOTCONN, errno.ECONNABORTED, errno.EIO, errno.ENOENT) for e in errors),
                f'writes to a dead mount failed with {[t.errno_name(e) for e in errors]}')
    # First, before anything else opens the top layer: the dead server's
    # last commits are in its WAL, which the snapshot must fold into the
    # layer it freezes.
    store.snapshot('crash', f'after-crash-{cycle}', readonly=True)
    t.check_equal(store.show('crash')['mounted_by'], 0, 'mounted_by after the server was killed')


def verify(m, durable, maybe):
    for rel, data in sorted(durable.items()):
        try:
            got = t.read_file(m.p(rel))
        except OSError as e:
            t.fail(f"{rel}: fsync'd before the crash, now {e}")
        t.check_bytes(got, data, f"{rel} (fsync'd before the crash)")
    for rel, options in sorted(maybe.items()):
        if os.path.exists(m.p(rel)):
            check_pages(t.read_file(m.p(rel)), options, f'{rel} (not fsync\'d)')


def check_term_during_last_commit(store):
    """After an unmount the server commits what it holds: SIGTERM sent to
    it meanwhile (as to hurry a stop along) loses none of it."""
    store.create('term')
    m = store.mount('term')
    m.mount()
    data = os.urandom(96 * MiB)
    t.write_file(m.p('big'), data)
    pid = m.pid
    subprocess.run(['fusermount3', '-u', m.path], check=True)
    m.mounted = False
    for _ in range(200):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            break
        time.sleep(0.005)
    t.check(not t.wait_gone([pid], 60), 'the server after its unmount and SIGTERM')
    with store.mount('term') as m2:
        t.check(os.path.exists(m2.p('big')), 'a file written before an unmount and SIGTERM is there')
        t.check_bytes(t.read_file(m2.p('big')), data, 'a file written before an unmount and SIGTERM')
    store.fsck()


def run():
    t.require_fuse()
    cycles = t.env_int('COWBOX_CRASH_CYCLES', 4)
    with t.Store('crash') as store:
        store.create('crash')
        durable, maybe = {}, {}
        m = store.mount('crash')
        for cycle in range(cycles):
            print(f'cycle {cycle}', flush=True)
            m.mount()
            try:
                verify(m, durable, maybe)
                orphan_fd = cycle_writes(m, cycle, durable, maybe)
                crash(store, m, cycle, busy=cycle % 2 == 1)
                try:
                    os.close(orphan_fd)
                except OSError:
                    pass  # its mount is gone
            except BaseException:
                if m.mounted:
                    m.unmount(force=True)
                raise
            with store.mount(f'after-crash-{cycle}', readonly=True) as sm:
                verify(sm, durable, maybe)
            if cycle == cycles - 1:
                # Straight after a crash, fsck may need to repair (a stale
                # lock, the orphan), and then finds nothing more.
                store.fsck(repair=True)
            m.mount()
            try:
                verify(m, durable, maybe)
            finally:
                m.unmount()
            store.fsck()
        store.run('scrub')
        print(f"{len(durable)} fsync'd files verified after {cycles} crashes")
        check_term_during_last_commit(store)


t.main(run)
