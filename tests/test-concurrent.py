#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Several processes at work on one store at once, as a build farm's jobs
are: each worker snapshots, writes through mounts, deletes, reaps, sends
and receives (some receives killed part way), lists, checks and scrubs, in
a random order of its own, while the others do the same and background
reapers, some of them killed with SIGKILL, fold and free what was deleted.
Each worker owns its subvolumes and knows what each must hold; every time
it looks, and at the end, every one of them holds exactly that. Listings never fail nor miss a subvolume,
fsck and scrub find nothing wrong while all this goes on, and once the
last subvolume is deleted and reaped, the store gives back its space.

One worker goes through cowboxd (when dbus-daemon is installed), with
workspaces, image renames and tasks in sandboxes. A checkout stays mounted and is written the whole time, its
server killed now and then; the workers snapshot it as it changes, and
each snapshot holds what was written before it was asked for.

  COWBOX_SEED=N                   replay one run (its seed is printed)
  COWBOX_CONCURRENT_WORKERS=N     workers (default 3)
  COWBOX_CONCURRENT_OPS=N         operations per worker (default 120)
"""

import collections
import contextlib
import hashlib
import json
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
import daemon_test as d  # noqa: E402
from cowbox_test import KiB  # noqa: E402

WORKERS = t.env_int('COWBOX_CONCURRENT_WORKERS', 3)
OPS = t.env_int('COWBOX_CONCURRENT_OPS', 120)
MAX_OWNED = 5
SIZES = [0, 1, 700, 4 * KiB, 9 * KiB, 64 * KiB, 64 * KiB + 1, 200 * KiB]
BASE_FILES = 80
SHARED_SOURCE = 'base'
LIVE = 'live'
RECEIVING = '.receiving-'    # what a receive under way is called
PROBE = 'probe'          # tests/sandbox-probe, for the tasks
SANDBOX_MOUNTS = {'dev', 'proc', 'tmp'}     # what a sandbox adds to /
# The weights of the operations a worker picks from.
OPERATIONS = {
    'snapshot': 6,
    'snapshot-live': 3,
    'write': 6,
    'verify': 3,
    'delete': 4,
    'reap': 2,
    'kill-reaper': 2,
    'throttle-reaper': 1,
    'send-receive': 2,
    'kill-receive': 1,
    'list': 3,
    'show': 2,
    'fsck': 1,
    'scrub': 1,
}


def content(rng, size):
    """Source-like text (compresses) or random bytes (does not)."""
    if size == 0:
        return b''
    if rng.random() < 0.5:
        line = f'static int f{rng.randrange(1 << 20)}(int x) {{ return x * {rng.randrange(99)}; }}\n'.encode()
        return (line * (size // len(line) + 1))[:size]
    return rng.randbytes(size)


class Tree:
    """What a subvolume must hold: its directories and its files' bytes."""

    def __init__(self, dirs=None, files=None):
        self.dirs = set(dirs or ())
        self.files = dict(files or {})

    def copy(self):
        return Tree(self.dirs, self.files)


def read_tree(root):
    """The Tree a mount holds, and the entries that are neither files nor
    directories."""
    tree, odd = Tree(), []
    for parent, dirs, files in os.walk(root):
        for name in dirs:
            tree.dirs.add(os.path.relpath(os.path.join(parent, name), root))
        for f in files:
            path = os.path.join(parent, f)
            rel = os.path.relpath(path, root)
            try:
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    odd.append(rel)
                    continue
                tree.files[rel] = t.read_file(path)
            except OSError as e:
                t.fail(f'{rel} is listed in {root} but cannot be read: {t.errno_name(e.errno)}')
    return tree, odd


def check_tree(root, expected, what):
    got, odd = read_tree(root)
    t.check(not odd, f'{what}: entries that are not files: {odd}')
    t.check_equal(sorted(got.dirs), sorted(expected.dirs), f'{what}: directories')
    t.check_equal(sorted(got.files), sorted(expected.files), f'{what}: files')
    for path, data in expected.files.items():
        t.check_bytes(got.files[path], data, f'{what}: {path}')


def reaper_at_work(store):
    """The pid of the reaper that holds the store's reaper lock (a delete's
    background reaper or `reap`, not fsck or scrub), or None."""
    pid = store.reaper_lock_holder()
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            argv = f.read().split(b'\0')
    except (OSError, TypeError):
        return None
    return pid if b'reap' in argv or b'delete' in argv else None


class LiveWriter:
    """A checkout that stays mounted the whole run and is written all the
    time: files created, replaced (written aside, then renamed over) and
    removed, some steps fsync'd and some not. The workers snapshot it while
    it is being written: a snapshot holds every step that returned before
    it was asked for, fsync'd or not, and of the steps after, only what they
    wrote (a file being written may be cut short). Now and then the writer
    kills its server and mounts the subvolume again: every name then holds
    what its last fsync'd step gave it, or what a later step did."""

    def __init__(self, store, seed):
        self.store = store
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.state = {}          # name -> bytes, after every step that returned
        self.history = []        # (name, bytes or None), each step's effect before it starts
        self.inflight = []       # the effects of the step under way
        self.at_mount = {}       # name -> bytes, when the subvolume was last mounted
        self.since_mount = {}    # name -> [(bytes or None, fsync'd)] since then
        # Held across a kill and the check after it, and across a
        # snapshot: what a snapshot must hold is lost with the server.
        self.kill_lock = threading.Lock()
        self.stop = threading.Event()
        self.error = None
        self.kills = 0
        self.steps = 0
        self.mount = None

    def start(self):
        self.store.create(LIVE)
        self.mount = self.store.mount(LIVE)
        self.mount.mount()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def finish(self):
        self.stop.set()
        self.thread.join()
        if self.error is not None:
            raise self.error
        self.mount.unmount()

    def begin(self, *effects):
        with self.lock:
            self.history.extend(effects)
            self.inflight = list(effects)

    def end(self, synced, *effects):
        with self.lock:
            for name, data in effects:
                if data is None:
                    self.state.pop(name, None)
                else:
                    self.state[name] = data
                self.since_mount.setdefault(name, [(self.at_mount.get(name), True)]).append((data, synced))
            self.inflight = []

    def run(self):
        try:
            while not self.stop.is_set():
                self.step()
                self.steps += 1
        except BaseException as e:  # noqa: B036 - reported by the main thread
            self.error = e

    def step(self):
        rng, p = self.rng, self.mount.p
        names = sorted(self.state)
        what = rng.choice(['create', 'create', 'replace', 'unlink'] if names else ['create'])
        sync = rng.random() < 0.5
        if rng.random() < 0.01:
            return self.kill()
        if what == 'create':
            name = f'n{self.steps}'
            data = content(rng, rng.choice(SIZES))
            self.begin((name, data))
            t.write_file(p(name), data, fsync=sync)
            self.end(sync, (name, data))
        elif what == 'replace':
            name, aside = rng.choice(names), f'aside{self.steps}'
            data = content(rng, rng.choice(SIZES))
            self.begin((aside, data))
            t.write_file(p(aside), data, fsync=sync)
            self.end(sync, (aside, data))
            self.begin((aside, None), (name, data))
            os.rename(p(aside), p(name))
            if sync:
                t.fsync_dir(p(''))
            self.end(sync, (aside, None), (name, data))
        else:
            name = rng.choice(names)
            self.begin((name, None))
            os.unlink(p(name))
            if sync:
                t.fsync_dir(p(''))
            self.end(sync, (name, None))

    def kill(self):
        with self.kill_lock:
            self.mount.kill()
            self.kills += 1
            self.mount.mount()
            got, odd = read_tree(self.mount.p(''))
            t.check(not odd and not got.dirs, f'the live checkout after a kill: entries that are not files: '
                    f'{odd + sorted(got.dirs)}')
            for name in sorted(set(self.since_mount) | set(got.files)):
                values = self.since_mount.get(name, [(self.at_mount.get(name), True)])
                last_synced = max(i for i, (_, synced) in enumerate(values) if synced)
                check_one(name, got.files.get(name), {v for v, _ in values[last_synced:]},
                          len(values) > last_synced + 1, 'the live checkout after its server was killed')
            with self.lock:
                self.state = dict(got.files)
                self.at_mount = dict(got.files)
                self.since_mount = {}

    def bounds(self):
        """What a snapshot taken from now on must hold at least: the state,
        and where in the history the changes that may follow start."""
        with self.lock:
            return dict(self.state), len(self.history) - len(self.inflight)

    def changes_since(self, start):
        with self.lock:
            return list(self.history[start:])

    @staticmethod
    def check(root, state, changes, what):
        """Checks that the tree at root holds state, changed by any of
        changes."""
        got, odd = read_tree(root)
        t.check(not odd and not got.dirs, f'{what}: entries that are not files: {odd + sorted(got.dirs)}')
        allowed = {name: {data} for name, data in state.items()}
        changed = set()
        for name, data in changes:
            allowed.setdefault(name, {None}).add(data)
            changed.add(name)
        for name in sorted(set(allowed) | set(got.files)):
            check_one(name, got.files.get(name), allowed.get(name, {None}), name in changed, what)


def check_one(name, have, could, may_be_cut, what):
    """A file holds one of could (None: absent), or, if may_be_cut, the
    start of one of them (a write under way)."""
    if have in could:
        return
    cut_short = may_be_cut and have is not None and any(c is not None and c.startswith(have) for c in could)
    t.check(cut_short, f'{what}: {name} holds {None if have is None else len(have)} bytes '
            f'{"" if have is None else hashlib.sha256(have).hexdigest()[:12]}, none of what it held or was '
            f'given: {sorted(-1 if c is None else len(c) for c in could)} bytes')


class Worker:
    operations = OPERATIONS

    def __init__(self, store, index, seed, base, live):
        self.store = store
        self.live = live
        self.index = index
        self.rng = random.Random(seed)
        self.owned = {}          # name -> (Tree, read-only)
        self.gone = set()        # names this worker deleted
        self.base = base
        self.counter = 0
        self.trace = []
        self.error = None
        self.kills = 0
        self.receives_killed = 0
        self.done = collections.Counter()

    def new_name(self):
        self.counter += 1
        return f'w{self.index}-{self.counter}'

    def log(self, text):
        self.trace.append(text)

    def run(self):
        try:
            ops, weights = zip(*self.operations.items())
            for i in range(OPS):
                op = self.rng.choices(ops, weights)[0]
                self.log(f'{i}: {op}')
                getattr(self, 'op_' + op.replace('-', '_'))()
                self.done[op] += 1
        except BaseException as e:  # noqa: B036 - reported by the main thread
            self.error = e

    def tree_of(self, name):
        return self.base if name == SHARED_SOURCE else self.owned[name][0]

    def pick_owned(self, writable=None):
        names = sorted(n for n, (_, ro) in self.owned.items() if writable is None or ro != writable)
        return self.rng.choice(names) if names else None

    def op_snapshot(self):
        if len(self.owned) >= MAX_OWNED:
            return self.op_delete()
        source = self.pick_owned() if self.owned and self.rng.random() < 0.7 else SHARED_SOURCE
        readonly = self.rng.random() < 0.4
        name = self.new_name()
        self.snapshot(source, name, readonly)
        self.owned[name] = (self.tree_of(source).copy(), readonly)
        self.log(f'  {source} -> {name}{" (read-only)" if readonly else ""}')

    def op_delete(self):
        name = self.pick_owned()
        if name is None:
            return
        self.delete(name)
        del self.owned[name]
        self.gone.add(name)
        self.log(f'  {name}')

    def delete(self, name):
        self.store.delete(name, reap=self.rng.random() < 0.7)

    def op_reap(self):
        # Without --wait: fails, naming the holder, if another reaper, fsck
        # or scrub is at work. Another worker may kill this reaper.
        wait = self.rng.random() < 0.5
        r = self.store.run('reap', *(['--wait'] if wait else []), expect=None)
        busy = r.code == 1 and (('running in process' in r.err and not wait) or 'is paused' in r.err)
        t.check(r.code in (0, -signal.SIGKILL) or busy, f'reap:\n{r.describe()}')

    def op_kill_reaper(self):
        pid = reaper_at_work(self.store)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
                self.kills += 1
                self.log(f'  killed {pid}')
            except ProcessLookupError:
                pass

    def op_throttle_reaper(self):
        """Slows every reaper down for a while (they then hold the reaper's
        lock longer), or stops them and lets them go again."""
        if self.rng.random() < 0.5:
            self.store.run('reap', '--pause')
            time.sleep(self.rng.random() * 0.3)
            self.store.run('reap', '--resume')
        else:
            # Not for good: at 1 MB/s a reap of this test's garbage takes
            # minutes, and every reap that waits for the lock waits that long.
            self.store.run('reap', '--rate', self.rng.choice(['1M', '8M']))
            time.sleep(self.rng.random() * 0.5)
            self.store.run('reap', '--rate', 'none')

    def op_write(self):
        name = self.pick_owned(writable=True)
        if name is None:
            return self.op_snapshot()
        tree = self.owned[name][0]
        with self.store.mount(name) as m:
            touched = set()
            for _ in range(self.rng.randint(1, 8)):
                self.change_one(m, tree, touched)
            for rel in sorted(touched):
                path = m.p(rel)
                if os.path.exists(path):
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            if self.rng.random() < 0.3:
                # A snapshot of a mounted subvolume holds what was written.
                if len(self.owned) < MAX_OWNED:
                    snap = self.new_name()
                    readonly = self.rng.random() < 0.5
                    self.store.snapshot(name, snap, readonly=readonly)
                    self.owned[snap] = (tree.copy(), readonly)
                    self.log(f'  snapshot of the mount -> {snap}')
            if self.rng.random() < 0.2:
                # Everything fsync'd must survive the server's death.
                m.kill()
                self.log('  killed the server')

    def change_one(self, m, tree, touched):
        rng = self.rng
        what = rng.choice(['create', 'create', 'overwrite', 'truncate', 'unlink', 'rename', 'mkdir'])
        files = sorted(tree.files)
        if what in ('overwrite', 'truncate', 'unlink', 'rename') and not files:
            what = 'create'
        if what == 'create':
            parent = rng.choice([''] + sorted(tree.dirs))
            rel = os.path.join(parent, f'new-{self.new_name()}')
            data = content(rng, rng.choice(SIZES))
            t.write_file(m.p(rel), data)
            tree.files[rel] = data
            touched.update((rel, parent))
        elif what == 'overwrite':
            rel = rng.choice(files)
            old = tree.files[rel]
            offset = rng.randrange(len(old) + 1)
            patch = content(rng, rng.choice([1, 100, 5000, 70 * KiB]))
            with open(m.p(rel), 'r+b') as f:
                f.seek(offset)
                f.write(patch)
            tree.files[rel] = old[:offset] + patch + old[offset + len(patch):]
            touched.add(rel)
        elif what == 'truncate':
            rel = rng.choice(files)
            size = rng.choice([0, 10, 5000, 66 * KiB, 300 * KiB])
            os.truncate(m.p(rel), size)
            old = tree.files[rel]
            tree.files[rel] = old[:size] + b'\0' * max(0, size - len(old))
            touched.add(rel)
        elif what == 'unlink':
            rel = rng.choice(files)
            os.unlink(m.p(rel))
            del tree.files[rel]
            touched.add(os.path.dirname(rel))
        elif what == 'rename':
            rel = rng.choice(files)
            parent = rng.choice([''] + sorted(tree.dirs))
            new = os.path.join(parent, f'moved-{self.new_name()}')
            os.rename(m.p(rel), m.p(new))
            tree.files[new] = tree.files.pop(rel)
            touched.update((os.path.dirname(rel), parent))
        else:
            parent = rng.choice([''] + sorted(tree.dirs))
            rel = os.path.join(parent, f'dir-{self.new_name()}')
            os.mkdir(m.p(rel))
            tree.dirs.add(rel)
            touched.add(parent)
        self.log(f'  {what}')

    def op_snapshot_live(self):
        """A snapshot of the checkout being written: it holds what the
        writer had done when it was asked for, and nothing it did not."""
        if len(self.owned) >= MAX_OWNED:
            return self.op_delete()
        name, readonly = self.new_name(), self.rng.random() < 0.5
        with self.live.kill_lock:
            state, start = self.live.bounds()
            self.snapshot(LIVE, name, readonly)
            changes = self.live.changes_since(start)
        with self.store.mount(name, readonly=True) as m:
            LiveWriter.check(m.p(''), state, changes, f'worker {self.index}: {name}, a snapshot of {LIVE}')
            self.owned[name] = (read_tree(m.p(''))[0], readonly)
        self.log(f'  {LIVE} -> {name}, {len(changes)} changes while it was taken')

    def snapshot(self, source, name, readonly):
        self.store.snapshot(source, name, readonly=readonly)

    def op_verify(self):
        name = self.pick_owned()
        if name is None:
            return
        tree, readonly = self.owned[name]
        with self.store.mount(name, readonly=True) as m:
            check_tree(m.p(''), tree, f'worker {self.index}: {name}')

    def op_send_receive(self):
        name = self.pick_owned(writable=False)
        if name is None or len(self.owned) >= MAX_OWNED:
            return
        copy = self.new_name()
        with self.sent(name) as stream:
            self.receive(stream, copy)
        self.owned[copy] = (self.owned[name][0].copy(), True)
        self.log(f'  {name} -> {copy}')

    @contextlib.contextmanager
    def sent(self, name):
        """A file with a send stream of name, removed at the end."""
        stream = os.path.join(self.store.tmp, f'{name}.stream')
        try:
            self.send(name, stream)
            yield stream
        finally:
            if os.path.exists(stream):
                os.unlink(stream)

    def send(self, name, stream):
        self.store.run('send', '-f', stream, name)

    def receive(self, stream, name):
        self.store.run('receive', '-f', stream, name)

    def op_kill_receive(self):
        """A receive killed part way leaves no image under its name (what it
        did leave, the next receive or cowboxd removes)."""
        name = self.pick_owned(writable=False)
        if name is None or len(self.owned) >= MAX_OWNED:
            return
        copy = self.new_name()
        with self.sent(name) as stream:
            receive = subprocess.Popen([t.tool(), '--store', self.store.path, 'receive', '-f', stream, copy],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            time.sleep(self.rng.random() * 0.05)
            receive.kill()
            err = receive.communicate()[1]
        t.check(receive.returncode in (0, -signal.SIGKILL), f'worker {self.index}: the receive of {copy}: {err}')
        # Killed after its commit, it made the whole image all the same.
        made = receive.returncode == 0 or copy in {s['name'] for s in self.store.list()}
        if made:
            self.owned[copy] = (self.owned[name][0].copy(), True)
            with self.store.mount(copy, readonly=True) as m:
                check_tree(m.p(''), self.owned[copy][0], f'worker {self.index}: {copy}, received')
        else:
            self.gone.add(copy)
            self.receives_killed += 1
        self.log(f'  {name} -> {copy}: {"made" if made else "killed before it was made"}')

    def op_list(self):
        names = {s['name'] for s in self.listed()}
        missing = sorted(set(self.owned) - names)
        t.check(not missing, f'worker {self.index}: the list misses {missing}')
        back = sorted(self.gone & names)
        t.check(not back, f'worker {self.index}: the list shows deleted {back}')

    def op_show(self):
        name = self.pick_owned()
        if name is None:
            return
        info = self.shown(name)
        tree, readonly = self.owned[name]
        t.check_equal(info['readonly'], readonly, f'worker {self.index}: {name} read-only')
        t.check_equal(info['inodes'], 1 + len(tree.dirs) + len(tree.files), f'worker {self.index}: inodes of {name}')

    def listed(self):
        return self.store.list()

    def shown(self, name):
        return self.store.show(name)

    def op_fsck(self):
        self.store.fsck()

    def op_scrub(self):
        self.store.run('scrub')


class DaemonWorker(Worker):
    """A worker that asks cowboxd where the daemon has a call for it:
    snapshots, deletes, listings, images sent and received, reaps, scrubs,
    and workspaces (a writable snapshot the daemon mounts, with read-only
    checkpoints to go back to). Writes and checks go through mounts of
    their own, as for the others."""

    operations = {**OPERATIONS, 'workspace': 5, 'task': 3, 'rename': 2}

    def __init__(self, store, index, seed, base, live, bus):
        super().__init__(store, index, seed, base, live)
        self.bus = bus
        self.workspaces = {}     # name -> (path, Tree, {label: Tree})

    def cowbox(self, *args, expect=0):
        return d.cowbox(self.bus, *args, expect=expect)

    def run(self):
        super().run()
        if self.error is None:
            try:
                for name in sorted(self.workspaces):
                    self.cowbox('workspace', 'rm', name)
            except BaseException as e:  # noqa: B036 - reported by the main thread
                self.error = e

    def snapshot(self, source, name, readonly):
        self.cowbox('snapshot', *(['-r'] if readonly else []), source, name)

    def delete(self, name):
        self.cowbox('rm', name)

    def op_reap(self):
        self.cowbox('reap')

    def op_scrub(self):
        self.cowbox('scrub')

    def listed(self):
        return json.loads(self.cowbox('--json', 'list').out)

    def shown(self, name):
        return json.loads(self.cowbox('--json', 'show', name).out)

    def send(self, name, stream):
        self.cowbox('image', 'send', '-f', stream, name)

    def receive(self, stream, name):
        self.cowbox('image', 'receive', '-f', stream, name)

    def op_workspace(self):
        """Creates a workspace, or changes one and checkpoints it, goes
        back to a checkpoint, or removes it; checks what it holds."""
        rng = self.rng
        if not self.workspaces or (len(self.workspaces) < 2 and rng.random() < 0.3):
            image = self.pick_owned(writable=False) or SHARED_SOURCE
            name = f'ws{self.index}-{self.new_name()}'
            path = os.path.join(self.store.tmp, name)
            self.cowbox('workspace', 'create', name, '--image', image, '--path', path)
            self.workspaces[name] = (path, self.tree_of(image).copy(), {})
            self.log(f'  workspace {name} of {image}')
            return
        name = rng.choice(sorted(self.workspaces))
        path, tree, checkpoints = self.workspaces[name]
        what = rng.choice(['change', 'change', 'checkpoint', 'restore', 'rm'])
        self.log(f'  workspace {name}: {what}')
        if what == 'change':
            mount = _Path(path)
            touched = set()
            for _ in range(rng.randint(1, 5)):
                self.change_one(mount, tree, touched)
            check_tree(path, tree, f'cowboxd: workspace {name}')
        elif what == 'checkpoint':
            label = f'c{self.new_name()}'
            self.cowbox('workspace', 'checkpoint', name, label)
            checkpoints[label] = tree.copy()
        elif what == 'restore' and checkpoints:
            label = rng.choice(sorted(checkpoints))
            self.cowbox('workspace', 'restore', name, label)
            tree = checkpoints[label].copy()
            self.workspaces[name] = (path, tree, checkpoints)
            check_tree(path, tree, f'cowboxd: workspace {name} back at {label}')
        elif what == 'rm':
            self.cowbox('workspace', 'rm', name)
            del self.workspaces[name]

    def op_rename(self):
        """Renames an image: the new name lists, the old one does not."""
        name = self.pick_owned(writable=False)
        if name is None:
            return
        new = self.new_name()
        self.cowbox('image', 'rename', name, new)
        self.owned[new] = self.owned.pop(name)
        self.gone.add(name)
        self.log(f'  {name} -> {new} by cowboxd')

    def op_task(self):
        """Runs a task in a sandbox made from an image: it sees the image's
        files as they are, whatever the others do meanwhile."""
        images = sorted(n for n, (tree, ro) in self.owned.items() if ro and tree.files.get(PROBE) == self.base.files[PROBE])
        image = self.rng.choice(images + [SHARED_SOURCE])
        tree = self.tree_of(image)
        if self.rng.random() < 0.5:
            r = self.cowbox('run', '--timeout', '120', image, '--', '/' + PROBE, 'ls', '/')
            top = {p.split('/')[0] for p in list(tree.files) + list(tree.dirs)}
            seen = set(r.out.split()) - SANDBOX_MOUNTS
            t.check_equal(sorted(seen), sorted(top), f'cowboxd: what a task in {image} sees in /')
        else:
            name = self.rng.choice(sorted(n for n in tree.files if '/' not in n))
            r = self.cowbox('run', '--timeout', '120', image, '--', '/' + PROBE, 'read', '/' + name)
            t.check_equal(r.out.split()[:2], ['read', str(len(tree.files[name]))],
                          f'cowboxd: what a task in {image} reads of {name}')
        self.log(f'  in {image}')


class _Path:
    """A directory that change_one() treats as a mount."""

    def __init__(self, path):
        self.path = path

    def p(self, *parts):
        return os.path.join(self.path, *parts)


def make_base(store, rng):
    tree = Tree()
    for i in range(8):
        tree.dirs.add(f'd{i}')
        if i % 3 == 0:
            tree.dirs.add(f'd{i}/sub')
    parents = sorted(tree.dirs) + ['']
    for i in range(BASE_FILES):
        tree.files[os.path.join(rng.choice(parents), f'f{i}')] = content(rng, rng.choice(SIZES))
    tree.files[PROBE] = t.read_file(os.path.join(os.environ.get('COWBOX_BUILD_ROOT', 'build'), 'tests', 'sandbox-probe'))
    store.create(SHARED_SOURCE)
    with store.mount(SHARED_SOURCE) as m:
        for rel in sorted(tree.dirs):
            os.mkdir(m.p(rel))
        for rel, data in tree.files.items():
            t.write_file(m.p(rel), data, mode=0o755 if rel == PROBE else 0o644, fsync=True)
    store.snapshot(SHARED_SOURCE, 'base-ro', readonly=True)
    store.delete(SHARED_SOURCE, reap=False)
    # The shared source is a read-only subvolume nobody writes.
    store.snapshot('base-ro', SHARED_SOURCE, readonly=True)
    store.delete('base-ro', reap=False)
    return tree


def print_logs(store, lines=40):
    """The ends of cowboxd's log and the store's: what the servers, reapers
    and the daemon said about a failure nobody saw happen."""
    for what, path in (('cowboxd', os.path.join(store.tmp, 'cowboxd.log')),
                       ('the store', os.path.join(store.path, 'log'))):
        if os.path.exists(path):
            with open(path, errors='replace') as f:
                tail = f.read().splitlines()[-lines:]
            print(f'the last {len(tail)} lines of the log of {what}:', flush=True)
            for line in tail:
                print(f'  {line}')


def run_seed(seed, store, bus):
    print(f'seed {seed}: {WORKERS} workers, {OPS} operations each'
          f'{", one of them through cowboxd" if bus else ""} (replay: COWBOX_SEED={seed})', flush=True)
    rng = random.Random(seed)
    base = make_base(store, rng)
    live = LiveWriter(store, rng.randrange(1 << 32))
    workers = [Worker(store, i, rng.randrange(1 << 32), base, live) for i in range(WORKERS - 1)]
    seed = rng.randrange(1 << 32)
    workers.append(DaemonWorker(store, WORKERS - 1, seed, base, live, bus) if bus
                   else Worker(store, WORKERS - 1, seed, base, live))
    live.start()
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    start = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    live.stop.set()
    live.thread.join()
    failed = [w for w in workers if w.error is not None]
    for w in failed:
        print(f'worker {w.index} failed: {w.error}\nits last operations:', flush=True)
        for line in w.trace[-30:]:
            print(f'  {line}')
    if live.error is not None:
        # The workers' checks of its snapshots fail after it does.
        print(f'the live writer failed: {live.error}', flush=True)
        raise live.error
    if failed or live.error is not None:
        print_logs(store)
    if failed:
        raise failed[0].error
    live.finish()
    done = sum((w.done for w in workers), collections.Counter())
    print(f'the workers took {time.monotonic() - start:.1f} s: '
          f'{", ".join(f"{n} {op}" for op, n in sorted(done.items()))}; '
          f'{sum(w.kills for w in workers)} reapers and {sum(w.receives_killed for w in workers)} receives killed; '
          f'the live writer took {live.steps} steps, '
          f'its server killed {live.kills} times', flush=True)

    store.run('reap', '--resume', '--rate', 'none')
    if bus:
        # The daemon deletes a task's snapshot once the task has ended, and
        # what a killed receive left within seconds.
        d.wait_for('the snapshots of the tasks and what killed receives left to go',
                   lambda: not any(s['name'].startswith(('sandbox-', RECEIVING)) for s in store.list()))
    else:
        store.create('empty')
        store.snapshot('empty', 'empty-image', readonly=True)
        stream = os.path.join(store.tmp, 'empty.stream')
        store.run('send', '-f', stream, 'empty-image')
        store.delete('empty-image', reap=False)
        store.run('receive', '-f', stream, 'empty-image')   # removes what killed receives left
        for name in ('empty', 'empty-image'):
            store.delete(name, reap=False)
    store.reap()
    store.fsck()
    for w in workers:
        for name in sorted(w.owned):
            with store.mount(name, readonly=True) as m:
                check_tree(m.p(''), w.owned[name][0], f'at the end: {name}')
    with store.mount(SHARED_SOURCE, readonly=True) as m:
        check_tree(m.p(''), base, f'at the end: {SHARED_SOURCE}')
    with store.mount(LIVE, readonly=True) as m:
        check_tree(m.p(''), Tree(files=live.state), f'at the end: {LIVE}')
    left = sorted(s['name'] for s in store.list())
    expected = sorted([SHARED_SOURCE, LIVE] + [n for w in workers for n in w.owned])
    t.check_equal(left, expected, 'subvolumes at the end')

    for name in left:
        store.delete(name, reap=False)
    store.reap()
    store.fsck()
    store.run('scrub')
    usage = store.usage()
    t.check_equal((usage['logical_bytes'], usage['reclaimable_bytes']), (0, 0),
                  'logical and reclaimable bytes of the emptied store')
    t.check(usage['pack_file_bytes'] < 1024 * KiB,
            f'the emptied store still has {usage["pack_file_bytes"]} bytes in pack files')


def run():
    t.require_root('mounts use FUSE with allow_other')
    t.require_fuse()
    for seed in t.seeds('COWBOX_SEED', 'COWBOX_CONCURRENT_SEEDS', 1):
        with t.Store('concurrent') as store:
            try:
                d.require_dbus()
            except t.Skip as e:
                print(f'no worker through cowboxd: {e}', flush=True)
                run_seed(seed, store, None)
                continue
            with d.bus_and_daemon(store) as (bus, daemon):
                run_seed(seed, store, bus)


if __name__ == '__main__':
    t.main(run)
