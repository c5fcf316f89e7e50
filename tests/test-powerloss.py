#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""A power loss keeps what was acknowledged: the store lives on ext4 on a
loop device whose disk (tests/blocklog, through FUSE) records every write
and every flush. Writers fsync files, or write them with O_DSYNC, through
mounts while snapshots are made, sent and received, and deleted, and reaps
fold layers; then the disk is rebuilt as a power loss at many points would
have left it: the log up to a point; at the point an acknowledgement was
given, only up to the flush before it (a disk may lose all it was not
asked to flush); or up to a flush and some of the writes after it, at
random (a disk's cache need not write in order). Each time the file
system is mounted and the store must open, fsck and scrub must find it
clean, every file whose fsync (or O_DSYNC write) returned reads back
exactly, every snapshot or image made is there with every file fsync'd
before it, every deleted subvolume is gone, and at some points the store
takes new work and stays clean. The snapshot of a task that a power loss
ended is removed by the next run, as after kill -9.

  COWBOX_POWERLOSS_SEED=N     replays a run
  COWBOX_POWERLOSS_CUTS=N     how many points are tried (default 16)
"""

import hashlib
import os
import random
import struct
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB  # noqa: E402

J = os.path.join
DISK_BYTES = 384 * 1024 * 1024
REC_WRITE, REC_FLUSH, REC_ZERO = 1, 2, 3
RECORD = struct.Struct('<IIQQ')


def blocklog():
    build = os.environ.get('COWBOX_BUILD_ROOT') or J(t.source_root(), 'build')
    path = J(build, 'tests', 'blocklog')
    if not os.access(path, os.X_OK):
        t.skip(f'{path} is not built')
    return path


class Disk:
    """An ext4 file system on a loop device over a recording disk."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.base = J(tmp, 'base.img')
        self.work = J(tmp, 'work.img')
        self.log = J(tmp, 'disk.log')
        self.blk = J(tmp, 'blk')
        self.fs = J(tmp, 'fs')
        self.server = None
        self.loop = None
        self.mounted = False

    def start(self):
        with open(self.base, 'wb') as f:
            f.truncate(DISK_BYTES)
        t.run_command(['mkfs.ext4', '-q', '-F', '-E', 'nodiscard', self.base])
        t.run_command(['cp', '--sparse=always', self.base, self.work])
        os.mkdir(self.blk)
        os.mkdir(self.fs)
        self.server = subprocess.Popen([blocklog(), self.work, self.log, self.blk, '-f'])
        for _ in range(100):
            if t.is_mounted(self.blk):
                break
            if self.server.poll() is not None:
                t.skip(f'blocklog could not mount its disk (exit status {self.server.returncode})')
            time.sleep(0.05)
        else:
            t.fail('blocklog did not mount its disk within 5 seconds')
        r = t.run_command(['losetup', '--find', '--show', J(self.blk, 'disk')], expect=None)
        if r.code != 0:
            t.skip(f'no loop device: {r.err.strip()}')
        self.loop = r.out.strip()
        t.run_command(['mount', '-t', 'ext4', self.loop, self.fs])
        self.mounted = True

    def pos(self):
        with open(J(self.blk, 'pos'), 'rb') as f:
            return int(f.read())

    def stop(self):
        if self.mounted:
            subprocess.run(['umount', self.fs], capture_output=True)
            self.mounted = False
        if self.loop:
            subprocess.run(['losetup', '-d', self.loop], capture_output=True)
            self.loop = None
        if self.server:
            subprocess.run(['fusermount3', '-u', self.blk], capture_output=True)
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
            self.server = None


def read_log(path):
    """The log's records: (type, offset, length, where its bytes are)."""
    records = []
    with open(path, 'rb') as f:
        at = 0
        while True:
            head = f.read(RECORD.size)
            if len(head) < RECORD.size:
                break
            kind, _, offset, length = RECORD.unpack(head)
            at += RECORD.size
            records.append((kind, offset, length, at))
            if kind == REC_WRITE:
                f.seek(length, os.SEEK_CUR)
                at += length
    return records


class Replay:
    """Builds the disk as the first n records of the log left it, for n
    growing."""

    def __init__(self, disk, records):
        self.records = records
        self.image = J(disk.tmp, 'replay.img')
        t.run_command(['cp', '--sparse=always', disk.base, self.image])
        self.done = 0
        self.log = open(disk.log, 'rb')
        self.out = open(self.image, 'r+b')

    def apply(self, records, out):
        for kind, offset, length, at in records:
            if kind == REC_WRITE:
                self.log.seek(at)
                out.seek(offset)
                out.write(self.log.read(length))
            elif kind == REC_ZERO:
                out.seek(offset)
                out.write(bytes(length))
        out.flush()

    def advance(self, n):
        t.check(n >= self.done, f'replay cannot go back from {self.done} to {n}')
        self.apply(self.records[self.done:n], self.out)
        self.done = n

    def close(self):
        self.log.close()
        self.out.close()


def durable_point(records, pos):
    """How much of the log a power loss after pos records keeps for sure:
    everything up to the last flush before it."""
    for i in range(min(pos, len(records)) - 1, -1, -1):
        if records[i][0] == REC_FLUSH:
            return i + 1
    return 0


def content(seed, size):
    rng = random.Random(seed)
    if rng.random() < 0.5:
        return t.pattern_bytes(size, seed)
    return rng.randbytes(size)


class Workload:
    """Writers and a snapshotter on the store; every acknowledgement with the
    log's position when it was given."""

    def __init__(self, store, disk, seed):
        self.store = store
        self.disk = disk
        self.rng = random.Random(seed)
        self.seed = seed
        self.lock = threading.Lock()
        self.files = {}         # (subvolume, path) -> [(pos, digest)] acknowledged versions
        self.snapshots = {}     # name -> (pos, {path: digest} acknowledged before it was asked for)
        self.deleted = {}       # name -> pos
        self.created = {}       # name -> pos
        self.readonly = {}      # snapshot name -> whether read-only
        self.errors = []

    def ack_file(self, subvol, rel, data):
        pos = self.disk.pos()
        with self.lock:
            self.files.setdefault((subvol, rel), []).append((pos, hashlib.sha256(data).hexdigest()))

    def acked_before(self, subvol):
        """The newest acknowledged version of each file of subvol."""
        with self.lock:
            return {rel: versions[-1][1] for (sv, rel), versions in self.files.items() if sv == subvol}

    def writer(self, subvol, mount, n, seed):
        rng = random.Random(seed)
        try:
            for i in range(n):
                d = mount.p(f'd{i % 4}')
                os.makedirs(d, exist_ok=True)
                size = rng.choice([0, 100, 3000, 5000, 64 * KiB, 70 * KiB, 200 * KiB + 17, 700 * KiB])
                data = content(seed * 1000 + i, size)
                rel = f'd{i % 4}/f{i}'
                if i % 5 == 4:
                    # Named for good first; then each write() with
                    # O_DSYNC returns once its data is durable.
                    t.write_file(mount.p(rel), b'')
                    t.fsync_dir(d)
                    fd = os.open(mount.p(rel), os.O_WRONLY | os.O_DSYNC | os.O_CLOEXEC)
                    try:
                        view = memoryview(data)
                        while view:
                            view = view[os.write(fd, view):]
                    finally:
                        os.close(fd)
                else:
                    t.write_file(mount.p(rel), data, fsync=True)
                    t.fsync_dir(d)
                self.ack_file(subvol, rel, data)
                if i % 3 == 2:
                    # Rewrite part of an earlier file in place.
                    rel = f'd{(i - 2) % 4}/f{i - 2}'
                    with open(mount.p(rel), 'r+b') as f:
                        old = f.read()
                        if len(old) > 10:
                            at = rng.randrange(len(old) - 10)
                            new = old[:at] + b'rewritten!' + old[at + 10:]
                            f.seek(at)
                            f.write(b'rewritten!')
                            f.flush()
                            os.fsync(f.fileno())
                            self.ack_file(subvol, rel, new)
        except BaseException as e:  # reported by the main thread
            self.errors.append(f'writer of {subvol}: {e!r}')

    def receive_copy(self, made):
        """Sends a read-only snapshot and receives it as an image."""
        frozen = [n for n in made if self.readonly.get(n)]
        if not frozen:
            return
        source = self.rng.choice(frozen)
        image = f'img-{len(self.snapshots)}'
        stream = J(self.store.tmp, f'{image}.stream')
        self.store.run('send', '-f', stream, source)
        self.store.run('receive', '-f', stream, image)
        os.unlink(stream)
        with self.lock:
            self.snapshots[image] = (self.disk.pos(), self.snapshots[source][1])

    def snapshotter(self, count):
        made = []
        for j in range(count):
            name = f'snap-{j}'
            before = self.acked_before('w')
            self.readonly[name] = self.rng.random() < 0.5
            self.store.snapshot('w', name, readonly=self.readonly[name])
            with self.lock:
                self.snapshots[name] = (self.disk.pos(), before)
            made.append(name)
            if self.rng.random() < 0.3:
                self.receive_copy(made)
            if len(made) > 2 and self.rng.random() < 0.6:
                victim = made.pop(self.rng.randrange(len(made) - 1))
                self.store.delete(victim, reap=self.rng.random() < 0.5)
                with self.lock:
                    self.deleted[victim] = self.disk.pos()
            if self.rng.random() < 0.4:
                self.store.reap()
            time.sleep(self.rng.random() * 0.2)

    def run(self):
        s = self.store
        for name in ('w', 'v'):
            s.create(name)
            self.created[name] = self.disk.pos()
        with s.mount('w') as mw, s.mount('v') as mv:
            writers = [threading.Thread(target=self.writer, args=('w', mw, 40, self.seed * 2)),
                       threading.Thread(target=self.writer, args=('v', mv, 25, self.seed * 2 + 1))]
            for th in writers:
                th.start()
            try:
                self.snapshotter(10)
            finally:
                for th in writers:
                    th.join()
        if self.errors:
            t.fail('; '.join(self.errors))
        s.reap()


def versions_after(records, versions, first):
    """{digest: a description} of the versions from first on."""
    out = {}
    for i, (pos, digest) in enumerate(versions):
        what = f'version {i + 1} of {len(versions)} (fsync returned at record {pos}, ' \
               f'durable from {durable_point(records, pos)})'
        if i >= first:
            out.setdefault(digest, what)
    return out


def describe_versions(records, versions, got):
    return '; '.join(('READ ' if d == got else '') + w for d, w in versions_after(records, versions, 0).items())


def check_subvolume_files(store, name, expected, what, describe=None):
    """Mounts name and checks that each file of expected ({path: acceptable
    digests}) reads back as one of them; every other file reads."""
    with store.mount(name) as m:
        for rel, digests in sorted(expected.items()):
            try:
                data = t.read_file(m.p(rel))
            except OSError as e:
                t.fail(f'{what}: {name}/{rel}, fsync\'d, cannot be read: {e}: '
                       f'{describe(rel, None) if describe else ""}')
            got = hashlib.sha256(data).hexdigest()
            if got not in digests:
                t.fail(f'{what}: {name}/{rel}, fsync\'d, reads back as other bytes ({len(data)} bytes): '
                       f'{describe(rel, got) if describe else ""}')
        for root, _, files in os.walk(m.path):
            for f in files:
                try:
                    t.read_file(J(root, f))
                except OSError as e:
                    t.fail(f'{what}: {name}: {J(root, f)} cannot be read: {e}')


def check_cut(store, work, records, cut, what, again=False):
    s = store
    r = s.run('fsck', expect=None)
    if r.code != 0:
        t.fail(f'{what}: fsck does not find the store clean:\n{r.describe()}')
    names = set(s.names())

    for name, (pos, before) in sorted(work.snapshots.items()):
        if durable_point(records, pos) <= cut and name not in work.deleted:
            t.check(name in names, f'{what}: snapshot {name}, made before the point, is missing')
    for name, pos in sorted(work.deleted.items()):
        if durable_point(records, pos) <= cut:
            t.check(name not in names, f'{what}: {name}, deleted before the point, is still there')

    for subvol, pos in sorted(work.created.items()):
        if durable_point(records, pos) > cut:
            continue
        t.check(subvol in names, f'{what}: subvolume {subvol}, made before the point, is missing')
        expected = {}
        for (sv, rel), versions in work.files.items():
            if sv != subvol:
                continue
            # The newest version durable by the point, or any later one.
            durable = [i for i, (pos, _) in enumerate(versions) if durable_point(records, pos) <= cut]
            if durable:
                expected[rel] = versions_after(records, versions, durable[-1])
        check_subvolume_files(s, subvol, expected, what,
                              lambda rel, got, sv=subvol: describe_versions(records, work.files[(sv, rel)], got))

    # Two of the snapshots and images, mounted each (the points check all
    # of them between them).
    present = [n for n in sorted(work.snapshots) if n in names]
    for name in random.Random(cut).sample(present, min(len(present), 2)):
        before = work.snapshots[name][1]
        # Files rewritten after the snapshot was asked for may hold any later
        # acknowledged version too (the writer ran on).
        expected = {}
        for rel, digest in before.items():
            versions = work.files[('w', rel)]
            i = [d for _, d in versions].index(digest)
            expected[rel] = {d for _, d in versions[i:]}
        check_subvolume_files(s, name, expected, f'{what}: snapshot {name}',
                              lambda rel, got: describe_versions(records, work.files[('w', rel)], got))

    r = s.run('scrub', expect=None)
    if r.code != 0:
        t.fail(f'{what}: scrub finds damage:\n{r.describe()}')
    if again:
        check_goes_on(s, names, what)


def check_goes_on(s, names, what):
    """The store takes new work after the loss: writes, a snapshot, deletes
    and a reap, and fsck still finds it clean."""
    data = t.random_bytes(150 * KiB, len(names))
    for subvol in ('w', 'v'):
        if subvol not in names:
            continue
        with s.mount(subvol) as m:
            t.write_file(m.p('after-the-loss'), data, fsync=True)
        s.snapshot(subvol, f'{subvol}-after')
    for name in sorted(names):
        if name.startswith('snap-'):
            s.delete(name, reap=False)
            break
    s.reap()
    r = s.run('fsck', expect=None)
    if r.code != 0:
        t.fail(f'{what}: fsck, after new work on the store, does not find it clean:\n{r.describe()}')
    for subvol in ('w', 'v'):
        if subvol in names:
            with s.mount(f'{subvol}-after', readonly=True) as m:
                t.check_bytes(t.read_file(m.p('after-the-loss')), data, f'{what}: a file written after the loss')


def check_image(store, replay, fs, check, extra=()):
    """Mounts a copy of the disk as a power loss left it (with the extra
    records written too), on a loop device of its own (one found by the
    file's name may still cache blocks of another copy), and calls
    check()."""
    image = replay.image + '.cut'
    t.run_command(['cp', '--sparse=always', replay.image, image])
    if extra:
        with open(image, 'r+b') as out:
            replay.apply(extra, out)
    loop = t.run_command(['losetup', '--find', '--show', image]).out.strip()
    try:
        t.run_command(['mount', '-t', 'ext4', loop, fs])
        try:
            check()
        finally:
            for m in store.mounts:
                if m.mounted:
                    m.unmount(force=True)
            store.mounts.clear()
            t.run_command(['umount', fs])
    finally:
        subprocess.run(['losetup', '-d', loop], capture_output=True)
    os.unlink(image)


def record_disk(s, label, workload):
    """Runs workload() on a new store on a recording disk in s.tmp/label;
    returns the disk (stopped) and its log's records."""
    tmp = J(s.tmp, label)
    os.mkdir(tmp)
    disk = Disk(tmp)
    try:
        disk.start()
        s.path = J(disk.fs, 'store')
        s.run('init')
        workload(disk)
    finally:
        for m in s.mounts:
            if m.mounted:
                m.unmount(force=True)
        s.mounts.clear()
        disk.stop()
    return disk, read_log(disk.log)


def replay_and_check(s, disk, records, points, check, torn=()):
    """For each point, mounts the disk as a power loss there left it and
    calls check(cut, what, point) with s.path the store on it. At the points in
    torn, the disk keeps everything up to the last flush and each write
    after it or not, at random: a disk's cache need not write in order."""
    replay = Replay(disk, records)
    fs = J(disk.tmp, 'cut')
    os.mkdir(fs)
    s.path = J(fs, 'store')
    try:
        for point in sorted(set(points) | set(torn)):
            cut = point
            extra = ()
            if cut in torn:
                flushed = durable_point(records, cut)
                rng = random.Random(cut)
                extra = [r for r in records[flushed:cut] if rng.random() < 0.5]
                what = f'power lost after record {cut} of {len(records)}, {len(extra)} of the ' \
                       f'{cut - flushed} after the last flush written'
                cut = flushed
            else:
                what = f'power lost after record {cut} of {len(records)}'
            print(what, flush=True)
            replay.advance(cut)
            check_image(s, replay, fs, lambda: check(cut, what, point), extra)
    finally:
        replay.close()


def check_store_work(s, seed, cuts):
    """Writers, snapshots, deletes and reaps."""
    state = {}

    def workload(disk):
        state['start'] = disk.pos()
        state['work'] = Workload(s, disk, seed)
        state['work'].run()
        state['end'] = disk.pos()

    disk, records = record_disk(s, 'work', workload)
    work, start, end = state['work'], state['start'], state['end']
    flushes = sum(1 for r in records if r[0] == REC_FLUSH)
    print(f'{len(records)} records, {flushes} flushes; the store was made at {start}, done at {end}', flush=True)

    # Where to cut: the durable point of acknowledgements, and anywhere.
    rng = random.Random(seed)
    acks = [pos for versions in work.files.values() for pos, _ in versions]
    acks += [pos for pos, _ in work.snapshots.values()] + list(work.deleted.values())
    points = sorted({durable_point(records, pos) for pos in acks})
    points = rng.sample(points, min(len(points), cuts // 2))
    anywhere = [rng.randrange(start, end + 1) for _ in range(cuts - len(points))]
    torn = set(anywhere[::2])
    points = set(p for p in points + anywhere[1::2] if p >= start) | {end}
    again = set(rng.sample(sorted(points | torn), min(len(points | torn), 4)))
    replay_and_check(s, disk, records, points,
                     lambda cut, what, point: check_cut(s, work, records, cut, what, point in again), torn)
    print(f'{len(points | torn)} points checked', flush=True)


def check_sandbox_record(s):
    """A run's record names its snapshot before a power loss can keep the
    snapshot without it: the next run after the restart removes it."""
    state = {}

    def workload(disk):
        s.create('base')
        workdir = J(disk.tmp, 'workdir')
        os.mkdir(workdir)
        p = subprocess.Popen([t.tool(), '--store', s.path, 'run', '--workdir', workdir, 'base', '--',
                              '/bin/sleep', '60'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not any(n.startswith('sandbox-') for n in s.names()):
                t.check(time.monotonic() < deadline, 'the snapshot of a running task appears')
                time.sleep(0.05)
            # The snapshot's catalog row has been committed, synced.
            state['made'] = disk.pos()
        finally:
            p.kill()
            p.wait()
        state['workdir'] = workdir

    disk, records = record_disk(s, 'sandbox', workload)

    def check(cut, what, point):
        r = s.run('fsck', expect=None)
        if r.code != 0:
            t.fail(f'{what}: fsck does not find the store clean:\n{r.describe()}')
        left = [n for n in s.names() if n.startswith('sandbox-')]
        t.check(left, f'{what}: the snapshot of the running task is there')
        # The machine came back more than a minute later: the records of
        # runs that died with it are stale.
        records_dir = s.path + '-sandboxes'
        old = time.time() - 3600
        for name in os.listdir(records_dir):
            os.utime(J(records_dir, name), (old, old))
        s.run('run', '--workdir', state['workdir'], 'base', '--', '/bin/true')
        s.reap()
        left = [n for n in s.names() if n.startswith('sandbox-')]
        t.check_equal(left, [], f'{what}: snapshots of runs the power loss ended, after the next run')

    replay_and_check(s, disk, records, {durable_point(records, state['made'])}, check)


def test():
    t.require_root('mounts an ext4 file system on a loop device')
    t.require_fuse()
    t.require_program('mkfs.ext4')
    t.require_program('losetup')
    seed = t.env_int('COWBOX_POWERLOSS_SEED', random.randrange(1 << 30))
    cuts = t.env_int('COWBOX_POWERLOSS_CUTS', 16)
    print(f'seed {seed} (COWBOX_POWERLOSS_SEED={seed} replays it)', flush=True)

    with t.Store('powerloss', init=False) as s:
        check_sandbox_record(s)
        check_store_work(s, seed, cuts)


if __name__ == '__main__':
    t.main(test)
