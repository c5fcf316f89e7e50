#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""'subvolume delete' starts a reaper in the background, from a process that
has the store open and exits at once. The reaper's work must survive that
exit: deleting a snapshot folds the origin's layers, and the origin keeps
every file, also when another reap follows at once. (A reaper that reused
the state of its parent's database connection lost its commits when the
parent closed: the origin came back empty.) A mount while the reaper folds
the origin's layers sees all of it too. The background reaper gives way to
the work that goes on meanwhile: it runs niced, at the lowest best-effort I/O
priority. Snapshots and listings beside background reapers lose nothing
(COWBOX_REAPER_RACE_FILES and COWBOX_REAPER_RACE_ROUNDS size that loop)."""

import ctypes
import fcntl
import os
import platform
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB  # noqa: E402

ROUNDS = 4
SNAPSHOT_ROUNDS = int(os.environ.get('COWBOX_REAPER_RACE_ROUNDS', '40'))
SNAPSHOT_FILES = int(os.environ.get('COWBOX_REAPER_RACE_FILES', '200000'))
REAPER_NICE = 10
IOPRIO_CLASS_BE = 2
REAPER_IO_LEVEL = 7
SYS_IOPRIO_GET = {'x86_64': 252, 'aarch64': 31}


def test_survives_exit():
    files = {f'f{i}': t.random_bytes(100 * KiB + i, i) for i in range(6)}
    files['small'] = b'small file\n'
    with t.Store('reaper-background') as store:
        store.create('main')
        with store.mount('main') as m:
            for name, content in files.items():
                t.write_file(m.p(name), content, fsync=True)
        for round in range(ROUNDS):
            store.snapshot('main', 'copy', readonly=True)
            store.run('subvolume', 'delete', 'copy')    # a background reaper
            if round % 2 == 0:
                store.reap()    # and one more at once
            # else: main is mounted while the background reaper folds it
            with store.mount('main', readonly=True) as m:
                t.check_equal(sorted(os.listdir(m.p(''))), sorted(files), f'round {round}: files of main')
                for name, content in files.items():
                    t.check_bytes(t.read_file(m.p(name)), content, f'round {round}: {name}')
            store.fsck()
        store.run('scrub')


def list_in_thread(store):
    """Lists the subvolumes and shows the store's usage (which reads the
    layers a fold is building) again and again in a thread until the event
    is set; the thread, the event and the list of failed commands."""
    stop, failures = threading.Event(), []

    def lister():
        while not stop.is_set():
            for command in (('subvolume', 'list'), ('usage',)):
                r = store.run(*command, expect=None)
                if r.code != 0:
                    failures.append(r.describe())
    th = threading.Thread(target=lister, daemon=True)
    th.start()
    return th, stop, failures


def test_snapshots_beside_reapers():
    """A build farm's loop: snapshot a checkout, delete the snapshot (which
    starts a background reaper), at once the next snapshot, while others
    list the subvolumes and look at the store's usage. A reaper folds the
    checkout's layers while the next snapshot waits for the checkout's
    lock: the snapshot must then freeze the top layer the fold left, not
    the one it read before it waited (which the fold had removed: the
    checkout's stack named a layer that was gone, and every file in it was
    lost). A listing must not fail either while layers are folded and
    dropped under it, nor a reaper while usage reads the layer it folds
    into (which kept the fold from finishing it). The checkout is large so
    that each fold takes long enough to be met."""
    build = os.environ.get('COWBOX_BUILD_ROOT')
    t.check(build, 'COWBOX_BUILD_ROOT is not set: run the tests with meson test')
    filler = os.path.join(build, 'bench', 'fill-inodes')
    with t.Store('reaper-snapshots') as store:
        t.run_command([filler, '--bytes', '64', store.path, 'checkout', str(SNAPSHOT_FILES)])
        before = store.show('checkout')
        th, stop, failures = list_in_thread(store)
        try:
            for i in range(SNAPSHOT_ROUNDS):
                store.snapshot('checkout', f'patch-{i}')
                store.run('subvolume', 'delete', f'patch-{i}')      # a background reaper
        finally:
            stop.set()
            th.join(60)
        store.reap()
        store.fsck()
        after = store.show('checkout')
        t.check_equal((after['inodes'], after['logical_bytes']), (before['inodes'], before['logical_bytes']),
                      'inodes and bytes of the checkout')
        with store.mount('checkout', readonly=True) as m:
            first = t.read_file(m.p('d0000/d0000/f000000'))
            t.check(first.startswith(b'int f0_0(void)'), f'the first file of the checkout holds {first!r}')
        t.check(not failures, f'{len(failures)} listings failed beside the reapers, the first:\n'
                f'{failures[0] if failures else ""}')
        failed = [line for line in store.log().splitlines() if 'reaping in the background failed' in line]
        t.check(not failed, f'{len(failed)} background reapers failed beside the listings, the first: '
                f'{failed[0] if failed else ""}')


def reaper_pid(store, timeout=10.0):
    """The pid of the reaper that holds the store's reaper lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = store.reaper_lock_holder()
        if pid:
            return pid
        time.sleep(0.01)
    t.fail(f'no reaper held the reaper lock of {store.path} within {timeout:.0f} s of the delete')


def wait_reaper_done(store, timeout=60.0):
    with open(os.path.join(store.path, 'locks', 'reaper.lock'), 'rb') as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                t.check(time.monotonic() < deadline, f'the reaper still runs {timeout:.0f} s after its rate was lifted')
                time.sleep(0.05)


def io_priority(pid):
    number = SYS_IOPRIO_GET.get(platform.machine())
    if number is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    value = libc.syscall(number, 1, pid)      # IOPRIO_WHO_PROCESS
    t.check(value >= 0, f'ioprio_get of {pid}: {os.strerror(ctypes.get_errno())}')
    return value >> 13, value & 0x1fff


def test_yields():
    with t.Store('reaper-yields') as store:
        store.create('doomed')
        with store.mount('doomed') as m:
            for i in range(4):
                t.write_file(m.p(f'f{i}'), t.random_bytes(256 * KiB, 100 + i), fsync=True)
        # A slow rate keeps the reaper alive long enough to look at it.
        store.run('reap', '--rate', '4K')
        store.run('subvolume', 'delete', 'doomed')
        pid = reaper_pid(store)
        try:
            with open(f'/proc/{pid}/stat') as f:
                fields = f.read().rsplit(')', 1)[1].split()
            t.check_equal(int(fields[16]), REAPER_NICE, 'nice value of the background reaper')
            prio = io_priority(pid)
            if prio is None:
                print(f'I/O priority not checked: no ioprio_get number known for {platform.machine()}', flush=True)
            else:
                t.check_equal(prio, (IOPRIO_CLASS_BE, REAPER_IO_LEVEL), 'I/O class and level of the background reaper')
        finally:
            store.run('reap', '--rate', 'none')
            wait_reaper_done(store)
        t.check_equal(store.usage()['reclaimable_bytes'], 0, 'bytes left to reclaim once the reaper is done')


def background_reapers(store):
    """The pids of this store's background reapers: the double-forked
    children of 'subvolume delete', alive after the delete returned."""
    return sorted(set(t.processes_with_arg(store.path)) & set(t.processes_with_arg('delete', exact=True)))


def test_one_waits():
    """While a reap runs, a burst of deletes leaves one reaper waiting for
    it, not one each: that one frees what every delete left."""
    deletes = 6
    with t.Store('reaper-one-waits') as store:
        for i in range(deletes):
            store.create(f'doomed{i}')
            with store.mount(f'doomed{i}') as m:
                t.write_file(m.p('f'), t.random_bytes(128 * KiB, 200 + i), fsync=True)
        store.reap()    # makes the reaper's lock file
        with open(os.path.join(store.path, 'locks', 'reaper.lock'), 'rb') as running:
            fcntl.flock(running, fcntl.LOCK_EX)
            for i in range(deletes):
                store.run('subvolume', 'delete', f'doomed{i}')
            deadline = time.monotonic() + 10
            while len(background_reapers(store)) > 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)     # and no more than one stays
            waiting = background_reapers(store)
            t.check_equal(len(waiting), 1, f'background reapers waiting behind a running reap after {deletes} deletes')
        wait_reaper_done(store)
        deadline = time.monotonic() + 10
        while background_reapers(store) and time.monotonic() < deadline:
            time.sleep(0.05)
        t.check_equal(background_reapers(store), [], 'background reapers left once the running reap ended')
        usage = store.usage()
        t.check_equal(usage['reclaimable_bytes'], 0, 'bytes left to reclaim after the one waiting reaper')
        t.check_equal(store.list(), [], 'subvolumes left after the deletes')


def run():
    t.require_fuse()
    sub = t.Subtests()
    sub.run('survives the exit of its parent', test_survives_exit)
    sub.run('yields to foreground work', test_yields)
    sub.run('one reaper waits behind a running one', test_one_waits)
    sub.run('snapshots beside background reapers', test_snapshots_beside_reapers)
    sub.check()


t.main(run)
