#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Thousands of seeded random file system operations, applied identically to
a plain directory of the host and to a mounted subvolume: every result must
be the same (data read, errors), and so must the trees, byte for byte and
attribute for attribute, also after a remount and in a snapshot.

Stacked runs go on writing while snapshots of the mounted subvolume are
taken (read-only and writable, with files held open across them), written
to (the writable ones), deleted and reaped (which folds the layers they
leave behind), and the server is killed after an fsync: every snapshot must
keep what the host tree held when it was taken, and the subvolume what the
host tree holds now, through every fold and remount, and fsck must find
the store consistent.

  COWBOX_SEED=N                       replay one seed (printed by every run)
  COWBOX_RANDOMOPS_SEEDS=N            how many seeds (default 3)
  COWBOX_RANDOMOPS_ITERATIONS=N       operations per seed (default 2000)
  COWBOX_STACKED_SEED=N               replay one seed of the stacked runs
  COWBOX_RANDOMOPS_STACKED_SEEDS=N    how many stacked runs (default 2)
  COWBOX_RANDOMOPS_EXCLUDE=a,b        leave out kinds of operation (to narrow down
                                      a failure; the sequence changes with it)
  COWBOX_RANDOMOPS_TRACE=FILE         on a failure, write the whole trace of the
                                      failed seed there (else its last
                                      TRACE_SHOWN lines are printed)
"""

import collections
import contextlib
import errno
import hashlib
import os
import random
import shutil
import stat
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB, MiB  # noqa: E402

NAMES = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'long-name-' + 'x' * 40, 'ünï']
MAX_ENTRIES = 250
TRACE_SHOWN = 400
MAX_DEPTH = 4
MAX_FILE = 2 * MiB
KEPT_SLOTS = 4
CHECK_EVERY = 500
STACK_EVERY = (40, 200)     # operations between two snapshots, deletes, reaps or remounts
MAX_SNAPSHOTS = 5
XATTR_NAMES = [f'user.k{i}' for i in range(6)]
UIDS = [0, 1, 1000, 65534]
FILE_MODES = [0o644, 0o600, 0o755, 0o444, 0o4755, 0o2755, 0o000]
DIR_MODES = [0o755, 0o700, 0o1777, 0o555]

# Errors POSIX lets two correct file systems report differently.
EQUIVALENT = {errno.EEXIST: errno.ENOTEMPTY}

OPEN_FLAGS = os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a FIFO never blocks


class HostState:
    """What the host tree holds now, from which operations pick paths."""

    def __init__(self, root):
        self.files, self.dirs, self.links, self.others = [], [''], [], []
        for rel, st in t.walk(root):
            if stat.S_ISREG(st.st_mode):
                self.files.append(rel)
            elif stat.S_ISDIR(st.st_mode):
                self.dirs.append(rel)
            elif stat.S_ISLNK(st.st_mode):
                self.links.append(rel)
            else:
                self.others.append(rel)
        self.count = len(self.files) + len(self.dirs) + len(self.links) + len(self.others) - 1

    def all(self):
        return self.files + self.dirs[1:] + self.links + self.others


def depth(rel):
    return rel.count('/') + 1 if rel else 0


class Generator:
    def __init__(self, rng, features):
        self.rng = rng
        self.features = features

    def data(self):
        rng = self.rng
        r = rng.random()
        if r < 0.55:
            size = rng.randrange(0, 3000)          # around the inline threshold
        elif r < 0.93:
            size = rng.randrange(3000, 200 * KiB)
        else:
            size = rng.randrange(200 * KiB, 700 * KiB)
        kind = rng.random()
        if kind < 0.6:
            return rng.randbytes(size)
        if kind < 0.9:
            return t.pattern_bytes(size, rng.randrange(1 << 16))
        return bytes(size)

    def offset(self):
        rng = self.rng
        r = rng.random()
        if r < 0.5:
            return rng.randrange(0, 300 * KiB)
        if r < 0.9:
            return rng.choice([0, 64 * KiB, 128 * KiB, 256 * KiB]) + rng.randrange(-100, 100) % (64 * KiB)
        return rng.randrange(0, MAX_FILE)

    def new_path(self, state):
        dirs = [d for d in state.dirs if depth(d) < MAX_DEPTH]
        parent = self.rng.choice(dirs)
        name = self.rng.choice(NAMES)
        return os.path.join(parent, name) if parent else name

    def any_path(self, state):
        """Usually an existing entry, sometimes a new name."""
        entries = state.all()
        if entries and self.rng.random() < 0.85:
            return self.rng.choice(entries)
        return self.new_path(state)

    def file(self, state):
        if state.files and self.rng.random() < 0.9:
            return self.rng.choice(state.files)
        return self.any_path(state)

    def target(self):
        parts = [self.rng.choice(NAMES) for _ in range(self.rng.randrange(1, 3))]
        return '/'.join(parts)

    def next(self, state):
        rng = self.rng
        full = state.count >= MAX_ENTRIES
        weights = {
            'create': 0 if full else 10, 'mkdir': 0 if full else 4, 'symlink': 0 if full else 3,
            'link': 0 if full else 3, 'mkfifo': 0 if full else 0.5,
            'write': 14, 'append': 4, 'truncate': 6, 'read': 8, 'stat': 6,
            'rename': 8, 'rename2': 3, 'unlink': 6 if not full else 25, 'rmdir': 3 if not full else 10,
            'chmod': 3, 'chown': 2, 'utime': 2, 'fsync': 1,
            'setxattr': 4 if self.features['xattr'] else 0,
            'removexattr': 2 if self.features['xattr'] else 0,
            'punch': 2 if self.features['punch'] else 0,
            'open_keep': 2, 'kwrite': 4, 'kread': 3, 'kclose': 1,
        }
        for kind in self.features['exclude']:
            weights[kind] = 0
        kinds = list(weights)
        kind = rng.choices(kinds, [weights[k] for k in kinds])[0]
        if kind == 'create':
            return (kind, self.new_path(state) if rng.random() < 0.7 else self.any_path(state),
                    rng.choice(FILE_MODES[:3]), self.data())
        if kind == 'mkdir':
            return (kind, self.new_path(state), rng.choice(DIR_MODES[:2]))
        if kind == 'symlink':
            return (kind, self.target(), self.new_path(state))
        if kind == 'link':
            return (kind, self.any_path(state), self.new_path(state))
        if kind == 'mkfifo':
            return (kind, self.new_path(state))
        if kind == 'write':
            return (kind, self.file(state), self.offset(), self.data())
        if kind == 'append':
            return (kind, self.file(state), self.data())
        if kind == 'truncate':
            return (kind, self.file(state), rng.choice([0, rng.randrange(0, 300 * KiB), rng.randrange(0, MAX_FILE)]))
        if kind == 'read':
            return (kind, self.file(state), self.offset(), rng.randrange(1, 300 * KiB))
        if kind == 'stat':
            return (kind, self.any_path(state))
        if kind == 'rename':
            dst = self.any_path(state) if rng.random() < 0.4 else self.new_path(state)
            return (kind, self.any_path(state), dst)
        if kind == 'rename2':
            return (kind, self.any_path(state), self.any_path(state),
                    rng.choice([t.RENAME_NOREPLACE, t.RENAME_EXCHANGE]))
        if kind == 'unlink':
            return (kind, self.any_path(state))
        if kind == 'rmdir':
            return (kind, rng.choice(state.dirs[1:]) if len(state.dirs) > 1 else self.new_path(state))
        if kind == 'chmod':
            p = self.any_path(state)
            return (kind, p, rng.choice(DIR_MODES if p in state.dirs else FILE_MODES))
        if kind == 'chown':
            return (kind, self.any_path(state), rng.choice(UIDS), rng.choice(UIDS))
        if kind == 'utime':
            base = 1_500_000_000 * 10**9
            return (kind, self.any_path(state), base + rng.randrange(10**17), base + rng.randrange(10**17))
        if kind == 'fsync':
            return (kind, self.any_path(state))
        if kind == 'setxattr':
            return (kind, self.any_path(state), rng.choice(XATTR_NAMES), rng.randbytes(rng.randrange(0, 200)))
        if kind == 'removexattr':
            return (kind, self.any_path(state), rng.choice(XATTR_NAMES))
        if kind == 'punch':
            return (kind, self.file(state), self.offset(), rng.randrange(1, 300 * KiB))
        if kind == 'open_keep':
            return (kind, rng.randrange(KEPT_SLOTS), self.file(state))
        if kind == 'kwrite':
            return (kind, rng.randrange(KEPT_SLOTS), self.offset(), self.data())
        if kind == 'kread':
            return (kind, rng.randrange(KEPT_SLOTS), self.offset(), rng.randrange(1, 300 * KiB))
        if kind == 'kclose':
            return (kind, rng.randrange(KEPT_SLOTS))
        raise AssertionError(kind)


def show_result(result):
    if result[0] == 'err':
        return t.errno_name(result[1])
    if isinstance(result[1], bytes):
        return f'{len(result[1])} bytes {hashlib.sha256(result[1]).hexdigest()[:8]}'
    return repr(result[1])


def describe(op):
    def short(x):
        if isinstance(x, (bytes, bytearray)):
            return f'<{len(x)} bytes {hashlib.sha256(x).hexdigest()[:8]}>'
        if isinstance(x, int) and x > 0o7777 and op[0] != 'utime':
            return str(x)
        if isinstance(x, int) and op[0] in ('chmod', 'create', 'mkdir'):
            return oct(x)
        return repr(x)
    return op[0] + '(' + ', '.join(short(x) for x in op[1:]) + ')'


class Tree:
    """One side: a root directory and its kept file descriptors."""

    def __init__(self, root):
        self.root = root
        self.kept = {}

    def p(self, rel):
        return os.path.join(self.root, rel) if rel else self.root

    def close_all(self):
        for fd in self.kept.values():
            os.close(fd)
        self.kept = {}

    def apply(self, op):
        """Returns what the operation observed: ('ok', value) or ('err', errno)."""
        try:
            return ('ok', self._apply(op))
        except OSError as e:
            return ('err', EQUIVALENT.get(e.errno, e.errno))

    def _apply(self, op):
        kind, args = op[0], op[1:]
        if kind == 'create':
            path, mode, data = args
            fd = os.open(self.p(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | OPEN_FLAGS, mode)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        elif kind == 'mkdir':
            os.mkdir(self.p(args[0]), args[1])
        elif kind == 'symlink':
            os.symlink(args[0], self.p(args[1]))
        elif kind == 'link':
            os.link(self.p(args[0]), self.p(args[1]), follow_symlinks=False)
        elif kind == 'mkfifo':
            os.mkfifo(self.p(args[0]), 0o644)
        elif kind in ('write', 'append'):
            flags = os.O_WRONLY | OPEN_FLAGS | (os.O_APPEND if kind == 'append' else 0)
            fd = os.open(self.p(args[0]), flags)
            try:
                if kind == 'append':
                    os.write(fd, args[1])
                else:
                    os.pwrite(fd, args[2], args[1])
            finally:
                os.close(fd)
        elif kind == 'truncate':
            os.truncate(self.p(args[0]), args[1])
        elif kind == 'read':
            fd = os.open(self.p(args[0]), os.O_RDONLY | OPEN_FLAGS)
            try:
                return os.pread(fd, args[2], args[1])
            finally:
                os.close(fd)
        elif kind == 'stat':
            st = os.lstat(self.p(args[0]))
            return (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                    None if stat.S_ISDIR(st.st_mode) else st.st_size,
                    None if stat.S_ISDIR(st.st_mode) else st.st_nlink)
        elif kind == 'rename':
            os.rename(self.p(args[0]), self.p(args[1]))
        elif kind == 'rename2':
            t.renameat2(self.p(args[0]), self.p(args[1]), args[2])
        elif kind == 'unlink':
            os.unlink(self.p(args[0]))
        elif kind == 'rmdir':
            os.rmdir(self.p(args[0]))
        elif kind == 'chmod':
            os.chmod(self.p(args[0]), args[1])
        elif kind == 'chown':
            os.chown(self.p(args[0]), args[1], args[2], follow_symlinks=False)
        elif kind == 'utime':
            os.utime(self.p(args[0]), ns=(args[1], args[2]), follow_symlinks=False)
        elif kind == 'fsync':
            fd = os.open(self.p(args[0]), os.O_RDONLY | os.O_NOFOLLOW | OPEN_FLAGS)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        elif kind == 'setxattr':
            os.setxattr(self.p(args[0]), args[1], args[2], follow_symlinks=False)
        elif kind == 'removexattr':
            os.removexattr(self.p(args[0]), args[1], follow_symlinks=False)
        elif kind == 'punch':
            fd = os.open(self.p(args[0]), os.O_WRONLY | OPEN_FLAGS)
            try:
                t.fallocate(fd, t.FALLOC_FL_PUNCH_HOLE | t.FALLOC_FL_KEEP_SIZE, args[1], args[2])
            finally:
                os.close(fd)
        elif kind == 'open_keep':
            slot, path = args
            if slot in self.kept:
                os.close(self.kept.pop(slot))
            self.kept[slot] = os.open(self.p(path), os.O_RDWR | OPEN_FLAGS)
        elif kind in ('kwrite', 'kread', 'kclose'):
            slot = args[0]
            if slot not in self.kept:
                return 'no descriptor'
            fd = self.kept[slot]
            if kind == 'kwrite':
                os.pwrite(fd, args[2], args[1])
            elif kind == 'kread':
                return os.pread(fd, args[2], args[1])
            else:
                os.close(self.kept.pop(slot))
        else:
            raise AssertionError(kind)
        return None


def host_features(tmp):
    probe = os.path.join(tmp, 'probe')
    t.write_file(probe, bytes(256 * KiB))
    features = {'xattr': True, 'punch': True, 'exclude': []}
    exclude = os.environ.get('COWBOX_RANDOMOPS_EXCLUDE', '')
    if exclude:
        features['exclude'] = [k for k in exclude.split(',') if k]
        print(f'note: leaving out {features["exclude"]}')
    try:
        os.setxattr(probe, 'user.probe', b'1')
    except OSError as e:
        print(f'note: the host directory has no user xattrs ({e}): no xattr operations')
        features['xattr'] = False
    fd = os.open(probe, os.O_WRONLY)
    try:
        t.fallocate(fd, t.FALLOC_FL_PUNCH_HOLE | t.FALLOC_FL_KEEP_SIZE, 4096, 65536)
    except OSError as e:
        print(f'note: the host directory cannot punch holes ({e}): no punch operations')
        features['punch'] = False
    finally:
        os.close(fd)
    os.unlink(probe)
    return features


def normalize_times(root, seed):
    """Gives every entry the same made-up times on both sides, children
    before parents, so that mtimes can be compared too."""
    entries = sorted(t.walk(root), key=lambda e: -depth(e[0]))
    for rel, _ in entries:
        h = int.from_bytes(hashlib.sha256(f'{seed}:{rel}'.encode()).digest()[:6], 'little')
        os.utime(os.path.join(root, rel), ns=(1_600_000_000 * 10**9 + h, 1_400_000_000 * 10**9 + h * 7),
                 follow_symlinks=False)


class Run:
    """One seed's operations, applied to the host tree and the mount alike,
    with what is needed to report and replay a difference: the trace of
    every operation, its result and every event between them."""

    def __init__(self, seed, replay):
        self.seed = seed
        self.replay = replay
        self.trace = []
        self.counts = collections.Counter()
        self.errors = collections.Counter()

    def fail(self, message):
        ops = '\n  '.join(self.trace[-10:])
        t.fail(f'seed {self.seed}: {message}\nlast operations:\n  {ops}\nreplay with {self.replay}')

    def note(self, event):
        self.trace.append(event)

    @contextlib.contextmanager
    def tracing(self):
        """Shows the trace when anything fails, fsck after a fold as much as
        a difference: a bug can lie thousands of operations back."""
        try:
            yield
        except BaseException:
            self.show_trace()
            raise

    def show_trace(self):
        path = os.environ.get('COWBOX_RANDOMOPS_TRACE')
        if path:
            with open(path, 'w') as f:
                f.write('\n'.join(self.trace) + '\n')
            print(f'seed {self.seed}: the trace of its {len(self.trace)} operations and events is in {path}',
                  flush=True)
            return
        shown = self.trace[-TRACE_SHOWN:]
        print(f'seed {self.seed}: the last {len(shown)} of {len(self.trace)} operations and events '
              f'(COWBOX_RANDOMOPS_TRACE=FILE keeps them all):', flush=True)
        print('  ' + '\n  '.join(shown), flush=True)

    def apply(self, i, op, host, mnt):
        want = host.apply(op)
        got = mnt.apply(op)
        self.trace.append(f'#{i} {describe(op)} -> {show_result(want)}')
        self.counts[op[0]] += 1
        if want[0] == 'err':
            self.errors[t.errno_name(want[1])] += 1
        if want == got:
            return
        self.trace[-1] += f', mount {show_result(got)}'
        extra = ''
        if want[0] == got[0] == 'ok' and isinstance(want[1], bytes) and isinstance(got[1], bytes):
            extra = f'; first difference at {t.first_difference(want[1], got[1])}'
        self.fail(f'operation #{i} {describe(op)}: host gave {show_result(want)}, '
                  f'mount gave {show_result(got)}{extra}')

    def compare(self, host_root, path, what, **kwargs):
        diffs = t.compare_trees(host_root, path, label_a='host', label_b=what, **kwargs)
        if diffs:
            self.fail(f'{what} differs from the host:\n  ' + '\n  '.join(diffs[:30]))

    def report(self, host_root):
        print(f'  operations: {dict(sorted(self.counts.items()))}')
        print(f'  errors both sides agreed on: {dict(sorted(self.errors.items()))}')
        entries = HostState(host_root).count
        print(f'  {entries} entries, {t.disk_usage(host_root) // KiB} KiB on the host', flush=True)


def run_seed(store, seed, iterations, features, host_root):
    print(f'seed {seed}: {iterations} operations (replay: COWBOX_SEED={seed} COWBOX_RANDOMOPS_ITERATIONS={iterations})',
          flush=True)
    name = f'random-{seed}'
    store.create(name)
    os.mkdir(host_root)
    os.chmod(host_root, 0o755)
    rng = random.Random(seed)
    gen = Generator(rng, features)
    run = Run(seed, f'COWBOX_SEED={seed} COWBOX_RANDOMOPS_ITERATIONS={iterations}')
    with run.tracing():
        with store.mount(name) as m:
            host, mnt = Tree(host_root), Tree(m.path)
            try:
                for i in range(iterations):
                    run.apply(i, gen.next(HostState(host_root)), host, mnt)
                    if (i + 1) % CHECK_EVERY == 0 or i + 1 == iterations:
                        run.compare(host_root, m.path, f'the mount after operation #{i}', mtime=False)
            finally:
                host.close_all()
                mnt.close_all()
            run.report(host_root)
            normalize_times(host_root, seed)
            normalize_times(m.path, seed)
            run.compare(host_root, m.path, 'the mount (times included)')
            m.remount()
            run.compare(host_root, m.path, 'the mount after a remount')
        store.snapshot(name, name + '-snap', readonly=True)
        with store.mount(name + '-snap') as s:
            run.compare(host_root, s.path, 'a read-only snapshot')


class Stack:
    """The snapshots of one stacked run, each with the host tree's copy
    from the moment it was taken."""

    def __init__(self, store, run, name, tmp):
        self.store = store
        self.run = run
        self.name = name
        self.tmp = tmp
        self.snapshots = {}     # name -> (host copy, read-only)
        self.taken = 0
        self.counts = collections.Counter()

    def snapshot(self, host_root, readonly):
        self.taken += 1
        name = f'{self.name}-s{self.taken}'
        self.run.note(f'snapshot{" -r" if readonly else ""} {name}')
        self.store.snapshot(self.name, name, readonly=readonly)
        copy = os.path.join(self.tmp, name)
        t.copy_tree(host_root, copy)
        self.snapshots[name] = (copy, readonly)
        self.counts['snapshot'] += 1

    def delete(self, name):
        self.run.note(f'delete {name}')
        self.store.delete(name, reap=False)
        shutil.rmtree(self.snapshots.pop(name)[0])
        self.counts['delete'] += 1

    def reap(self):
        self.run.note('reap')
        self.store.reap()
        self.counts['reap'] += 1

    def write_branch(self, gen, rng, i):
        """Writes into a writable snapshot for a while: its stack forks
        from the subvolume's at the layer they share."""
        writable = sorted(n for n, (_, readonly) in self.snapshots.items() if not readonly)
        if not writable:
            return
        name = rng.choice(writable)
        copy = self.snapshots[name][0]
        self.run.note(f'writes into {name}')
        with self.store.mount(name) as s:
            host, mnt = Tree(copy), Tree(s.path)
            try:
                for k in range(rng.randrange(10, 60)):
                    self.run.apply(f'{i}.{name}.{k}', gen.next(HostState(copy)), host, mnt)
            finally:
                host.close_all()
                mnt.close_all()
            self.run.compare(copy, s.path, f'snapshot {name} after writes into it', mtime=False)
        self.counts['branch writes'] += 1

    def check_snapshots(self, when):
        for name, (copy, readonly) in sorted(self.snapshots.items()):
            with self.store.mount(name, readonly=readonly) as s:
                self.run.compare(copy, s.path, f'snapshot {name} {when}', mtime=False)


def run_stacked_seed(store, seed, iterations, features, tmp):
    replay = f'COWBOX_STACKED_SEED={seed} COWBOX_RANDOMOPS_ITERATIONS={iterations}'
    print(f'stacked seed {seed}: {iterations} operations (replay: {replay})', flush=True)
    name = f'stacked-{seed}'
    host_root = os.path.join(tmp, f'host-{name}')
    store.create(name)
    os.mkdir(host_root)
    os.chmod(host_root, 0o755)
    rng = random.Random(seed)
    gen = Generator(rng, features)
    run = Run(seed, replay)
    stack = Stack(store, run, name, tmp)
    next_event = rng.randrange(*STACK_EVERY)
    with run.tracing():
        with store.mount(name) as m:
            host, mnt = Tree(host_root), Tree(m.path)
            try:
                for i in range(iterations):
                    run.apply(i, gen.next(HostState(host_root)), host, mnt)
                    if i + 1 < next_event:
                        continue
                    next_event = i + 1 + rng.randrange(*STACK_EVERY)
                    event = rng.choices(['snapshot', 'delete', 'reap', 'remount', 'branch', 'crash'],
                                        [5, 3, 2, 1, 2, 1])[0]
                    if event == 'snapshot' and len(stack.snapshots) < MAX_SNAPSHOTS:
                        # Files held open stay open: their next writes must not
                        # reach the snapshot.
                        stack.snapshot(host_root, readonly=rng.random() < 0.5)
                    elif event == 'branch':
                        stack.write_branch(gen, rng, i)
                    elif event == 'delete' and stack.snapshots:
                        stack.delete(rng.choice(sorted(stack.snapshots)))
                    elif event == 'reap':
                        # Frozen layers fold under the running server.
                        stack.reap()
                        run.compare(host_root, m.path, f'the mount after a reap at #{i}', mtime=False)
                        stack.check_snapshots(f'after a reap at #{i}')
                    elif event == 'crash':
                        # A directory's fsync commits everything: after a kill
                        # the subvolume is what the host tree is, less the
                        # files that were only held open.
                        fd = os.open(m.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                        try:
                            os.fsync(fd)
                        finally:
                            os.close(fd)
                        run.note('fsync of the root, kill -9 of the server')
                        host.close_all()
                        mnt.kept = {}   # gone with the server
                        m.kill()
                        store.fsck()
                        m.mount()
                        stack.counts['crash'] += 1
                        run.compare(host_root, m.path, f'the mount after a kill at #{i}', mtime=False)
                    elif event == 'remount':
                        # Unmounted, the writable top folds too.
                        host.close_all()
                        mnt.close_all()
                        run.note('remount, reap and fsck between')
                        m.unmount()
                        stack.reap()
                        store.fsck()
                        m.mount()
                        stack.counts['remount'] += 1
                        run.compare(host_root, m.path, f'the mount after a reap while unmounted at #{i}', mtime=False)
            finally:
                host.close_all()
                mnt.close_all()
            run.report(host_root)
            print(f'  stack events: {dict(sorted(stack.counts.items()))}', flush=True)
            run.compare(host_root, m.path, 'the mount at the end', mtime=False)
        for snapshot in sorted(stack.snapshots)[:-1]:
            stack.delete(snapshot)
        stack.reap()
        store.fsck()
        stack.check_snapshots('at the end')
        with store.mount(name) as m:
            run.compare(host_root, m.path, 'the subvolume at the end, remounted', mtime=False)


def run():
    t.require_fuse()
    iterations = t.env_int('COWBOX_RANDOMOPS_ITERATIONS', 2000)
    seeds = t.seeds('COWBOX_SEED', 'COWBOX_RANDOMOPS_SEEDS', 3)
    stacked = t.seeds('COWBOX_STACKED_SEED', 'COWBOX_RANDOMOPS_STACKED_SEEDS', 2)
    # A replay runs only the seed it names.
    if os.environ.get('COWBOX_SEED') and not os.environ.get('COWBOX_STACKED_SEED'):
        stacked = []
    elif os.environ.get('COWBOX_STACKED_SEED') and not os.environ.get('COWBOX_SEED'):
        seeds = []
    print(f'seeds {seeds}, stacked {stacked}', flush=True)
    os.umask(0)
    with t.Store('randomops') as store:
        features = host_features(store.tmp)
        for seed in seeds:
            run_seed(store, seed, iterations, features, os.path.join(store.tmp, f'host-{seed}'))
        for seed in stacked:
            run_stacked_seed(store, seed, iterations, features, store.tmp)


t.main(run)
