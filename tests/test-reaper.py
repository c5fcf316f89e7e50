#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The reaper can be paused, and runs at a bounded rate: while paused no
reaper frees anything (the space stays reclaimable, and a reap says it is
paused); after resuming, a reaper limited to 2 MiB/s takes at least as long
as the rate says to free what was deleted, and frees all of it. While a
reaper marks and sweeps, a writer's fsync of small files goes through, and
one that stores new blocks waits for it; a mount that has committed
everything keeps no reaper waiting. fsck and scrub wait for a reaper to
finish. A writer storing blocks does not wait for the punching of dead
blocks at the reaper's rate, and a reaper paused in its sweep leaves what it
has not punched out counted as reclaimable. A file unlinked while open
when a snapshot froze it is freed once nothing can use it any more, and
stays whole while its server still has it open; a reap that frees such
files from several layers keeps the layers' stacks whole. cowboxd takes up
the work its reap left when it found the reaper paused once the reaper is
resumed."""

import fcntl
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
import daemon_test as d  # noqa: E402
from cowbox_test import MiB  # noqa: E402

DATA = 8 * MiB
RATE = 2 * MiB


def fill(store, name, seed):
    store.create(name)
    with store.mount(name) as m:
        for i in range(4):
            t.write_file(m.p(f'f{i}'), t.random_bytes(DATA // 4, seed * 10 + i), fsync=True)


def fsync_in_thread(path, data):
    """Writes data into path and fsyncs it in a thread; the thread and
    the list where it puts its error, if any."""
    errors = []

    def write():
        try:
            t.write_file(path, data, fsync=True)
        except OSError as e:
            errors.append(e)
    th = threading.Thread(target=write, daemon=True)
    th.start()
    return th, errors


def commits_during_gc(store):
    """The store's GC lock, held exclusively as a reaper holds it while it
    marks and sweeps: an fsync that adds no block reference (a file small
    enough to be kept inline) must not wait for it; one that stores blocks
    must, until the lock is let go."""
    store.create('gc')
    with store.mount('gc') as m:
        t.write_file(m.p('warm'), b'x', fsync=True)
        fd = os.open(os.path.join(store.path, 'locks', 'gc.lock'), os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            small, small_errors = fsync_in_thread(m.p('small'), b'inline content\n')
            small.join(30)
            t.check(not small.is_alive(), 'an fsync of a small file waited for the mark and sweep')
            big, big_errors = fsync_in_thread(m.p('big'), t.random_bytes(256 * 1024, 5))
            big.join(1.5)
            t.check(big.is_alive(), 'an fsync storing new blocks went on during the mark and sweep')
        finally:
            os.close(fd)
        big.join(60)
        t.check(not big.is_alive(), 'an fsync storing new blocks still waits after the sweep')
        t.check(not small_errors and not big_errors, f'errors: {small_errors + big_errors}')
    with store.mount('gc') as m:
        t.check_bytes(t.read_file(m.p('small')), b'inline content\n', 'the small file')
        t.check_bytes(t.read_file(m.p('big')), t.random_bytes(256 * 1024, 5), 'the file of new blocks')


def paused_mid_sweep(store):
    """A reaper that has unindexed the dead blocks punches them out of
    their packs at its rate: a writer storing new blocks meanwhile does not
    wait for that. Paused then, the bytes still wait, and usage (by which
    the daemon starts reaps) must say so; the next reap frees them."""
    fill(store, 'swept', 3)
    store.create('writer')
    store.delete('swept', reap=False)
    store.run('reap', '--rate', '2M')
    with store.mount('writer') as m:
        t.write_file(m.p('warm'), b'x', fsync=True)
        reaper = subprocess.Popen([t.tool(), '--store', store.path, 'reap', '--wait'],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            while store.usage()['data_bytes'] > 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            start = time.monotonic()
            t.write_file(m.p('new'), t.random_bytes(256 * 1024, 7), fsync=True)
            seconds = time.monotonic() - start
            store.run('reap', '--pause')
        finally:
            err = reaper.communicate(timeout=60)[1].decode(errors='replace')
        t.check(seconds < 1.5, f'an fsync storing new blocks took {seconds:.2f} s while the reaper punched '
                'out dead blocks at its rate')
    t.check(reaper.returncode == 1 and 'paused' in err, f'the reaper paused in its sweep: {err}')
    usage = store.usage()
    waiting = usage['pack_file_bytes'] - usage['data_bytes']
    t.check(waiting >= DATA // 2, f'the paused sweep freed {DATA - waiting} bytes of {DATA}: not paused in time')
    t.check(usage['reclaimable_bytes'] >= waiting - 64 * 1024,
            f"reclaimable bytes after a pause in the sweep: {usage['reclaimable_bytes']}, "
            f'while the packs hold {waiting} bytes of no block')
    store.run('reap', '--resume', '--rate', 'none')
    store.reap()
    usage = store.usage()
    t.check_equal(usage['reclaimable_bytes'], 0, 'reclaimable bytes after the next reap')
    t.check(usage['pack_file_bytes'] - usage['data_bytes'] < 64 * 1024,
            f"the packs after the next reap: {usage['pack_file_bytes']} bytes for {usage['data_bytes']} of data")


def daemon_resumes():
    """cowboxd's reap finds the reaper paused and ends; once 'reap
    --resume' lets reapers run again, the daemon takes the work up by
    itself (the resume is no call of its)."""
    if not all(shutil.which(p) for p in ('dbus-daemon', 'busctl', 'gdbus', 'dbus-send')):
        print('the resume of the daemon\'s reaper not checked: no D-Bus tools', flush=True)
        return
    with t.Store('reaper-resume') as store:
        fill(store, 'a', 4)
        store.run('reap', '--pause')
        store.delete('a', reap=False)
        with d.bus_and_daemon(store) as (bus, daemon):
            d.wait_for('the paused reap job to end',
                       lambda: json.loads(d.cowbox(bus, '--json', 'status').out)['jobs'] == [])
            time.sleep(3)
            t.check(store.usage()['reclaimable_bytes'] >= DATA, 'the daemon reaped while the reaper was paused')
            store.run('reap', '--resume')
            d.wait_for('the daemon to reap after the resume', lambda: store.usage()['reclaimable_bytes'] == 0)


def idle_mount_lets_reaper_in(store):
    """A mount that has committed everything holds no GC lock, so a reaper
    never waits for an idle mount. Written just before, and fsync'd while
    the server may be storing the same blocks ahead of the commit: a flush
    ahead whose blocks the commit took left the lock held until the next
    change."""
    store.create('idle')
    with store.mount('idle') as m:
        for i in range(16):
            fd = os.open(m.p(f'f{i % 4}'), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, t.random_bytes(80 * 64 * 1024, 100 + i))
                time.sleep(0.045 + i * 0.002)
                os.fsync(fd)
            finally:
                os.close(fd)
            time.sleep(1.3)     # past the next commit
            r = store.run('reap', '--wait', expect=None, timeout=15)
            t.check(r.code == 0, f'reap --wait beside an idle mount, round {i}:\n{r.describe()}')


def checks_wait_for_reaper(store):
    """fsck and scrub wait while a reaper runs (here the test holds the
    reaper's lock, as a reaper does, and names itself in it): a reaper folds
    and drops layers and frees blocks, which would look to them like a
    broken or damaged store. They say whom they wait for, and finish once
    the lock is let go."""
    fd = os.open(os.path.join(store.path, 'locks', 'reaper.lock'), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    procs = {}
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f'{os.getpid()}\n'.encode(), 0)
        for what in ('fsck', 'scrub'):
            procs[what] = subprocess.Popen([t.tool(), '--store', store.path, what], stdin=subprocess.DEVNULL,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(1.5)
        for what, p in procs.items():
            t.check(p.poll() is None, f'{what} ran to its end while a reaper held its lock')
        r = store.run('reap', expect=1)
        t.check(f'running in process {os.getpid()}' in r.err, f'reap beside a reaper did not name it:\n{r.describe()}')
    finally:
        os.close(fd)
    for what, p in procs.items():
        out, err = p.communicate(timeout=120)
        err = err.decode(errors='replace')
        t.check_equal(p.returncode, 0, f'{what} after the reaper let go (stdout {out!r}, stderr {err!r})')
        t.check(f'{what} waits for process {os.getpid()} to finish reaping' in err,
                f'{what} did not say whom it waited for: {err!r}')


def reap_counts_what_it_frees():
    """What a reap says it freed is what the store's files gave back: the
    blocks of deleted subvolumes, and those a writer stored but never
    indexed (killed between the two), in a pack no index names."""
    with t.Store('reaper-count') as store:
        def check_reap(what):
            before = sum(t.disk_usage(os.path.join(store.path, d)) for d in ('packs', 'layers'))
            freed = store.json('reap', '--wait')['bytes_freed']
            gone = before - sum(t.disk_usage(os.path.join(store.path, d)) for d in ('packs', 'layers'))
            t.check(gone >= DATA, f'the reap gave back {gone} bytes of {what}')
            t.check(abs(freed - gone) <= gone // 10,
                    f'{what}: the reap said it freed {freed} bytes; the store gave back {gone}')

        store.create('killed')
        m = store.mount('killed')
        m.mount()
        with open(m.p('unsynced'), 'wb') as f:
            for i in range(8):
                f.write(t.random_bytes(MiB, 90 + i))
        time.sleep(1)           # blocks are stored ahead of the commit
        m.kill()
        db = sqlite3.connect(os.path.join(store.path, 'catalog.db'))
        t.check(db.execute('DELETE FROM blocks').rowcount > 0, 'blocks stored ahead of the commit')
        db.commit()
        db.close()
        store.delete('killed', reap=False)
        check_reap('a pack no index names')

        fill(store, 'dead', 5)
        store.delete('dead', reap=False)
        check_reap('a deleted subvolume')


ORPHAN = 20 * MiB


def check_orphan_freed(store, image, before, what):
    """After a reap, image holds nothing of the orphan and the store gave
    back its blocks (before: usage --json before the reap)."""
    store.reap()
    info = store.show(image)
    t.check(info['referenced_bytes'] < MiB,
            f'{what}: {image} still references {info["referenced_bytes"]} bytes '
            f'({info["exclusive_bytes"]} exclusive) after the reap')
    freed = before['data_bytes'] - store.usage()['data_bytes']
    t.check(freed >= ORPHAN, f'{what}: the reap freed {freed} of the {ORPHAN} bytes of the unlinked file')
    store.fsck()


def open_orphan(m, seed):
    """A file of ORPHAN bytes, committed, then unlinked and kept open."""
    data = t.random_bytes(ORPHAN, seed)
    f = open(m.p('big'), 'wb+')
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
    os.unlink(m.p('big'))
    t.fsync_dir(m.path)
    return f, bytearray(data)


def orphans_frozen_by_snapshots():
    """A file unlinked but still open when a snapshot froze the top layer
    left its row and blocks in the frozen layer: nothing ever freed them
    (the server forgets only rows of its own top). Once the subvolume that
    had it open is gone, the reap frees them; while its server still has
    it open, folds keep it whole, even once written after the snapshot."""
    with t.Store('reaper-orphans') as store:
        store.create('o')
        keep = t.random_bytes(200 * 1024, 10)
        with store.mount('o') as m:
            t.write_file(m.p('keep'), keep, fsync=True)
            store.snapshot('o', 'base', readonly=True)  # a layer below
            f, _ = open_orphan(m, 11)
            store.snapshot('o', 'img', readonly=True)
            f.close()
        store.fsck()
        store.delete('o', reap=False)
        check_orphan_freed(store, 'img', store.usage(), 'closed after the snapshot')
        layers = sorted(os.listdir(os.path.join(store.path, 'layers')))
        store.reap()
        t.check_equal(sorted(os.listdir(os.path.join(store.path, 'layers'))), layers,
                      'layer files after a reap that has nothing to do')
        with store.mount('img', readonly=True) as m:
            t.check_equal(sorted(os.listdir(m.path)), ['keep'], 'files of the snapshot')
            t.check_bytes(t.read_file(m.p('keep')), keep, 'a file below the dropped one')

        # The server dies with the orphan in its top; another process
        # snapshots the subvolume.
        store.create('k')
        m = store.mount('k')
        m.mount()
        f, _ = open_orphan(m, 12)
        m.kill()
        try:
            f.close()
        except OSError:
            pass
        store.snapshot('k', 'kimg', readonly=True)
        t.check_equal(store.show('kimg')['logical_bytes'], 0, 'bytes of files in the snapshot')
        store.fsck()
        store.delete('k', reap=False)
        check_orphan_freed(store, 'kimg', store.usage(), 'its server killed')

        # Open across two snapshots and written in between; the first
        # snapshot goes, and a fold merges the layers the file is in.
        store.create('w')
        with store.mount('w') as m:
            f, data = open_orphan(m, 13)
            store.snapshot('w', 'w1', readonly=True)
            patch = t.random_bytes(3 * MiB, 14)
            f.seek(5 * MiB + 123)
            f.write(patch)
            f.flush()
            os.fsync(f.fileno())
            data[5 * MiB + 123:5 * MiB + 123 + len(patch)] = patch
            store.snapshot('w', 'w2', readonly=True)
            store.delete('w1', reap=False)
            store.reap()
            store.fsck()
            f.seek(0)
            t.check_bytes(f.read(), bytes(data), 'the open unlinked file after a fold')
            f.seek(ORPHAN - 1000)
            f.write(b'y' * 2000)
            f.flush()
            os.fsync(f.fileno())
            data[ORPHAN - 1000:] = b'y' * 2000
            f.seek(0)
            t.check_bytes(f.read(), bytes(data), 'the open unlinked file written after the fold')
            f.close()
        store.fsck()
        store.delete('w', reap=False)
        check_orphan_freed(store, 'w2', store.usage(), 'written after a snapshot')

        # The same with both snapshots kept: one reap rewrites two frozen
        # layers, the second above the first, which the first rewrite
        # replaced.
        store.create('c')
        with store.mount('c') as m:
            t.write_file(m.p('keep'), keep, fsync=True)
            f, _ = open_orphan(m, 15)
            store.snapshot('c', 'c1', readonly=True)
            f.seek(5 * MiB)
            f.write(t.random_bytes(3 * MiB, 16))
            f.flush()
            os.fsync(f.fileno())
            store.snapshot('c', 'c2', readonly=True)
            f.close()
        store.delete('c', reap=False)
        store.reap()
        for image in ('c1', 'c2'):
            with store.mount(image, readonly=True) as m:
                t.check_equal(sorted(os.listdir(m.path)), ['keep'], f'files of {image}')
                t.check_bytes(t.read_file(m.p('keep')), keep, f'a file below the dropped one in {image}')
        store.fsck()


def run():
    t.require_fuse()
    with t.Store('reaper') as store:
        fill(store, 'a', 1)
        fill(store, 'b', 2)
        store.run('reap', '--pause')
        store.delete('a', reap=False)
        store.run('subvolume', 'delete', 'b')   # starts a background reaper, which must wait
        r = store.run('reap', expect=1)
        t.check('paused' in r.err, f'reap while paused:\n{r.describe()}')
        time.sleep(1)
        usage = store.usage()
        t.check(usage['reclaimable_bytes'] >= 2 * DATA,
                f"reclaimable bytes while paused: {usage['reclaimable_bytes']}, expected at least {2 * DATA}")

        settings = store.json('reap', '--resume', '--rate', '2M')
        t.check_equal(settings, {'paused': False, 'rate_bytes_per_sec': RATE, 'hurried': False}, 'reaper settings')
        start = time.monotonic()
        store.run('reap', '--wait', timeout=120)
        seconds = time.monotonic() - start
        freed = usage['data_bytes'] - store.usage()['data_bytes']
        print(f'freed {freed} bytes in {seconds:.2f} s at a limit of {RATE} bytes/s', flush=True)
        t.check(freed >= 2 * DATA, f'the reaper freed {freed} bytes of {2 * DATA}')
        t.check(seconds >= 0.8 * freed / RATE,
                f'{freed} bytes freed in {seconds:.2f} s: faster than the limit of {RATE} bytes/s')
        t.check_equal(store.usage()['reclaimable_bytes'], 0, 'reclaimable bytes after the reap')
        store.run('reap', '--rate', 'none')
        store.fsck()
        paused_mid_sweep(store)
        store.fsck()
        commits_during_gc(store)
        idle_mount_lets_reaper_in(store)
        store.fsck()
        checks_wait_for_reaper(store)
    reap_counts_what_it_frees()
    orphans_frozen_by_snapshots()
    daemon_resumes()


t.main(run)
