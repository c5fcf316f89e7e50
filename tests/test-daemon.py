#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""cowboxd on a private system bus, through standard clients (busctl, gdbus,
dbus-send) and the cowbox client: every kind of call (a property, a
listing, a change, a job with its signals, an object of a subvolume), bad
arguments answered with an error name and a sentence and nothing changed,
a job cancelled, kill -9 of the daemon in the middle of a receive and a
restart that finds the truth and leaks nothing, and access: an
unprivileged user may list and inspect but is refused every change, by the
bus policy and by the daemon itself; a member of the cowbox group may
change things."""

import ctypes
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
import daemon_test as d  # noqa: E402
import stream_test as st  # noqa: E402

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fuzz-corpus')
MANY_SUBVOLUMES = 150
IN_OPEN = 0x20
IN_CREATE = 0x100
LAYER_FILE = re.compile(r'^(\d+)\.db(-wal|-shm|-journal)?$')


class LayerWatch:
    """The layer files opened and created in a store's layers directory,
    seen through inotify."""

    def __init__(self, store):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            t.fail(f'inotify_init1: {os.strerror(ctypes.get_errno())}')
        path = os.path.join(store.path, 'layers').encode()
        if self.libc.inotify_add_watch(self.fd, path, IN_OPEN | IN_CREATE) < 0:
            t.fail(f'inotify_add_watch: {os.strerror(ctypes.get_errno())}')

    def events(self):
        """(mask, file name) of the layer files touched since the last call."""
        seen = []
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return seen
            i = 0
            while i < len(buf):
                _, mask, _, length = struct.unpack_from('iIII', buf, i)
                name = buf[i + 16:i + 16 + length].rstrip(b'\0').decode()
                if LAYER_FILE.match(name):
                    seen.append((mask, name))
                i += 16 + length

    def close(self):
        os.close(self.fd)


def check_standard_clients(bus, store):
    r = d.run(bus, ['busctl', '--system', 'introspect', 'org.cowbox1', '/org/cowbox1'])
    for member in ('.ReceiveImage', '.Snapshot', '.GetStatus', '.JobRemoved', '.Store'):
        t.check(member in r.out, f'busctl introspect lists {member}:\n{r.out}')
    r = d.run(bus, ['busctl', '--system', 'get-property', 'org.cowbox1', '/org/cowbox1', 'org.cowbox1.Manager',
                    'Store'])
    t.check(store.path in r.out, f'the Store property names the store:\n{r.out}')
    t.check_equal(d.gdbus_json(bus, 'ListImages'), [], 'ListImages of an empty store')
    r = d.run(bus, ['dbus-send', '--system', '--print-reply', '--dest=org.cowbox1', '/org/cowbox1',
                    'org.cowbox1.Manager.GetStatus'])
    t.check('"reaper"' in r.out and '"usage"' in r.out and '"reserve_bytes"' in r.out,
            f'dbus-send GetStatus:\n{r.out}')


def table_rows(text, header):
    """The rows of a table the client printed, split on runs of spaces,
    after checking its header."""
    lines = text.splitlines()
    t.check(lines and lines[0].split() == header, f'a table with the columns {header}:\n{text}')
    return [line.split() for line in lines[1:]]


def check_client_tables(bus):
    """What `cowbox` prints for people: each subvolume once, in a row of
    its own with the right columns; one subvolume's fields; the status."""
    rows = table_rows(d.cowbox(bus, 'list').out, ['NAME', 'READ-ONLY', 'LOGICAL', 'STORED', 'EXCLUSIVE'])
    t.check_equal(sorted((r[0], r[1]) for r in rows), [('base', 'yes'), ('base-v2', 'yes'), ('task', 'no')],
                  'names and read-only of cowbox list')
    rows = table_rows(d.cowbox(bus, 'image', 'list').out, ['NAME', 'READ-ONLY', 'LOGICAL', 'STORED', 'EXCLUSIVE'])
    t.check_equal(sorted(r[0] for r in rows), ['base', 'base-v2'], 'names of cowbox image list')
    show = d.cowbox(bus, 'show', 'base-v2').out
    info = d.gdbus_json(bus, 'GetSubvolume', 'base-v2')
    for field, value in (('Name', 'base-v2'), ('UUID', info['uuid']), ('Read-only', 'yes'),
                         ('Inodes', str(info['inodes']))):
        t.check(re.search(rf'^{field}: +{re.escape(value)}$', show, re.M), f'{field} in cowbox show:\n{show}')
    status = d.cowbox(bus, 'status').out
    t.check(re.search(r'^Subvolumes: +3$', status, re.M), f'the subvolumes counted by cowbox status:\n{status}')


def check_jobs_and_objects(bus, store):
    # Signals, watched the way any client would.
    monitor_log = os.path.join(store.tmp, 'signals')
    monitor = subprocess.Popen(['dbus-monitor', '--system', "type='signal',sender='org.cowbox1'"],
                               env=dict(os.environ, **bus.env), stdout=open(monitor_log, 'w'),
                               stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    try:
        # A job by busctl, with a path the daemon reads.
        r = d.run(bus, ['busctl', '--system', 'call', 'org.cowbox1', '/org/cowbox1', 'org.cowbox1.Manager',
                        'ReceiveImageFromPath', 'ss', os.path.join(CORPUS, 'btrfs-v1-full'), '{"name": "base"}'])
        t.check(r.out.startswith('uo '), f'ReceiveImageFromPath returns a job:\n{r.out}')
        deadline = time.monotonic() + 30
        while 'base' not in d.names(bus) and time.monotonic() < deadline:
            time.sleep(0.1)
        t.check_equal(d.names(bus), ['base'], 'subvolumes after the receive job')
        # The increment, through the cowbox client and a file descriptor.
        d.cowbox(bus, 'image', 'receive', '-f', os.path.join(CORPUS, 'btrfs-v1-incremental'), 'base-v2')
        t.check_equal(d.names(bus), ['base', 'base-v2'], 'subvolumes after the increment')

        # A stream names its image itself, but never as a workspace, a
        # checkpoint or a sandbox does.
        for reserved in ('workspace-dev@planted', 'sbx-planted'):
            path = os.path.join(store.tmp, 'reserved.stream')
            with open(path, 'wb') as f:
                f.write(st.simple_stream(reserved, body=[st.command('mkfile', ('path', 'f'), ('ino', 257))]))
            r = d.cowbox(bus, 'image', 'receive', '-f', path, expect=1)
            t.check('kept for others' in r.err and reserved in r.err,
                    f'a stream that names its image {reserved}:\n{r.err}')
        t.check_equal(d.names(bus), ['base', 'base-v2'], 'subvolumes after streams with reserved names')

        # A received image made writable is no longer its sender's: it
        # keeps no received UUID to take increments meant for the original.
        d.cowbox(bus, 'image', 'receive', '-f', os.path.join(CORPUS, 'btrfs-v1-full'), 'thawed')
        received = d.gdbus_json(bus, 'GetSubvolume', 'thawed')
        t.check(received['received_uuid'] and received['stransid'] > 0, f'a received image: {received}')
        d.gdbus_call(bus, 'SetReadOnly', 'thawed', 'false')
        d.gdbus_call(bus, 'SetReadOnly', 'thawed', 'true')
        thawed = d.gdbus_json(bus, 'GetSubvolume', 'thawed')
        t.check(not thawed['received_uuid'] and thawed['stransid'] == 0, f'a received image made writable: {thawed}')
        d.cowbox(bus, 'rm', 'thawed')

        # A subvolume's object: properties and methods.
        r = d.gdbus_call(bus, 'Snapshot', 'base', 'task', '{}')
        t.check('/org/cowbox1/subvolume/task' in r.out, f'Snapshot returns the object path:\n{r.out}')
        r = d.run(bus, ['busctl', '--system', 'get-property', 'org.cowbox1', '/org/cowbox1/subvolume/task',
                        'org.cowbox1.Subvolume', 'ReadOnly'])
        t.check_equal(r.out.strip(), 'b false', 'ReadOnly of a writable snapshot')
        r = d.gdbus_call(bus, 'Snapshot', 'snap-of-task', '{"readonly": true}', path='/org/cowbox1/subvolume/task',
                         interface='org.cowbox1.Subvolume')
        t.check(d.gdbus_json(bus, 'GetSubvolume', 'snap-of-task')['readonly'], 'snapshot through the object')
        path = re.search(r"'(/org/cowbox1/subvolume/[^']+)'", r.out).group(1)
        t.check_equal(path, '/org/cowbox1/subvolume/snap_2dof_2dtask', 'the escaped object path of a name')
        d.gdbus_call(bus, 'Delete', path=path, interface='org.cowbox1.Subvolume')

        check_client_tables(bus)

        # Send, scrub and reap jobs through the client.
        out = os.path.join(store.tmp, 'sent.stream')
        d.cowbox(bus, 'image', 'send', '-f', out, 'base')
        t.check(os.path.getsize(out) > 100000, 'the stream cowboxd sent')
        r = d.cowbox(bus, '--json', 'scrub')
        t.check_equal(json.loads(r.out)['blocks_damaged'], 0, 'damaged blocks after scrub')
        d.cowbox(bus, 'reap')
        time.sleep(0.5)
    finally:
        monitor.terminate()
        monitor.wait()
    log = open(monitor_log).read()
    for signal_name in ('JobNew', 'JobRemoved', 'SubvolumeNew', 'SubvolumeRemoved', 'PropertiesChanged'):
        if signal_name == 'PropertiesChanged':
            continue  # sent only while a job runs long enough
        t.check(f'member={signal_name}' in log, f'signal {signal_name} was seen:\n{log[-3000:]}')


def check_receive_progress(bus, store):
    """The progress line of a receive from a file on a terminal only goes
    forward: the file is read twice (checked whole, then applied), and the
    job counts both readings as one piece of work."""
    store.create('progress-src')
    with store.mount('progress-src') as m:
        with open(m.p('big'), 'wb') as f:
            for _ in range(160):
                f.write(os.urandom(1 << 20))
    store.snapshot('progress-src', 'progress-image', readonly=True)
    stream = os.path.join(store.tmp, 'progress.stream')
    store.run('send', '-f', stream, 'progress-image')
    store.delete('progress-src')
    store.delete('progress-image')
    code, out, term = t.run_on_terminal([d.client_exe(), 'image', 'receive', '-f', stream, 'progress-copy'],
                                        env=bus.env)
    os.unlink(stream)
    t.check_equal(code, 0, f'cowbox image receive on a terminal (it printed {out!r})')
    shown = [int(p) for p in re.findall(r'\] +(\d+)% ', term)]
    t.check(len(set(shown)) > 2, f'the receive showed too little progress to judge: {term!r}')
    t.check(shown == sorted(shown), f'the progress of a receive went back: {shown}')
    t.check(term.endswith('\r\x1b[K' + "Received image 'progress-copy'.\r\n") or term.endswith('\r\x1b[K'),
            f'the progress line was not removed at the end: {term[-200:]!r}')
    d.cowbox(bus, 'image', 'rm', 'progress-copy')


def check_bus_without_policy(store):
    """A system bus without cowbox's policy installed (a machine where
    'meson install' has not run): cowboxd says what to install, and
    scripts/run-demo, which the README gives as the first thing to try,
    goes on with a private bus of its own."""
    with t.Store('no-policy') as other:
        bus = d.Bus(other, 'none')
        try:
            r = t.run_command([d.daemon_exe(), '--store', other.path], env=bus.env, expect=1, timeout=60)
            t.check('org.cowbox1.conf' in r.err and 'policy' in r.err,
                    f'cowboxd on a bus that does not let it own its name:\n{r.describe()}')
            if not os.path.exists(os.path.join(t.source_root(), 'build', 'build.ninja')):
                print('SKIP: run-demo: no build/ in the checkout for it to use', flush=True)
                return
            source = other.new_dir('demo-source')
            t.write_file(os.path.join(source, 'stdio.h'), b'int printf(const char *, ...);\n')
            r = t.run_command([os.path.join(t.source_root(), 'scripts', 'run-demo')], timeout=600,
                              env=dict(bus.env, COWBOX_SKIP_INSTALL='1', COWBOX_DEMO_SOURCE=source,
                                       COWBOX_DEMO_TASKS='2', COWBOX_DEMO_DIR=other.new_dir('demo')))
            t.check('a private one at' in r.out and 'patch 2: sees 1 patch line' in r.out,
                    f'run-demo on a system bus without the policy:\n{r.describe()}')
        finally:
            bus.stop()


def check_bad_arguments(bus, store):
    before = d.names(bus)
    cases = [
        ('Snapshot', ['base', 'x', '{not json'], 'org.cowbox1.Error.InvalidJSON'),
        ('Snapshot', ['base', 'x', '[1, 2]'], 'org.cowbox1.Error.InvalidJSON'),
        ('Snapshot', ['base', 'x', '{"readonly": "yes"}'], 'org.cowbox1.Error.InvalidJSON'),
        ('Snapshot', ['base', 'x', '{"frobnicate": true}'], 'org.cowbox1.Error.InvalidJSON'),
        ('Snapshot', ['base', 'x', '{"readonly": true, "readonly": false}'], 'org.cowbox1.Error.InvalidJSON'),
        ('Snapshot', ['nope', 'x', '{}'], 'org.cowbox1.Error.NoSuchSubvolume'),
        ('Snapshot', ['base', '../escape', '{}'], 'org.cowbox1.Error.InvalidName'),
        ('Snapshot', ['base', '', '{}'], 'org.cowbox1.Error.InvalidName'),
        ('Snapshot', ['base', 'a/b', '{}'], 'org.cowbox1.Error.InvalidName'),
        ('Snapshot', ['base', 'x' * 300, '{}'], 'org.cowbox1.Error.InvalidName'),
        ('Snapshot', ['base', 'base-v2', '{}'], 'org.cowbox1.Error.NameTaken'),
        ('Snapshot', ['base', '.receiving-1-1', '{}'], 'org.cowbox1.Error.InvalidName'),
        # The names workspaces and sandboxes make for themselves.
        ('Snapshot', ['base', 'workspace-x@fake', '{}'], 'org.cowbox1.Error.InvalidName'),
        ('CreateSubvolume', ['sbx-later'], 'org.cowbox1.Error.InvalidName'),
        ('Rename', ['task', 'workspace-y+restoring'], 'org.cowbox1.Error.InvalidName'),
        ('RunTask', ['base', "['/probe']", '{"name": "sbx-z", "keep": true}'], 'org.cowbox1.Error.InvalidName'),
        ('CreateSubvolume', ['base'], 'org.cowbox1.Error.NameTaken'),
        ('DeleteSubvolume', ['nope'], 'org.cowbox1.Error.NoSuchSubvolume'),
        ('RemoveImage', ['task'], 'org.cowbox1.Error.NotReadOnly'),
        ('RemoveImage', ['nope'], 'org.cowbox1.Error.NoSuchImage'),
        ('Rename', ['base', 'base-v2'], 'org.cowbox1.Error.NameTaken'),
        ('SetQuota', ['task', '18446744073709551615'], 'org.freedesktop.DBus.Error.InvalidArgs'),
        ('GetSubvolume', ['nope'], 'org.cowbox1.Error.NoSuchSubvolume'),
        ('ReceiveImageFromPath', ['relative/path', '{}'], 'org.freedesktop.DBus.Error.InvalidArgs'),
        ('ReceiveImageFromPath', ['/nonexistent/stream', '{}'], 'org.freedesktop.DBus.Error.FileNotFound'),
        ('ReceiveImageFromPath', ['/etc/passwd/stream', '{}'], 'org.freedesktop.DBus.Error.FileNotFound'),
        ('RunTask', ['base', "['/probe']", '{"name": ".receiving-99-0", "keep": true}'],
         'org.cowbox1.Error.InvalidName'),
        ('RunTask', ['base', "['/probe']", '{"name": "a/b"}'], 'org.cowbox1.Error.InvalidName'),
        ('RunTask', ['base', "['/probe']", '{"uid": 4294967296}'], 'org.cowbox1.Error.InvalidJSON'),
        ('RunTask', ['base', "['/probe']", '{"uid": 4294967295}'], 'org.cowbox1.Error.InvalidJSON'),
        ('RunTask', ['base', "['/probe']", '{"gid": -1}'], 'org.cowbox1.Error.InvalidJSON'),
        ('RunTask', ['base', "['/probe']", '{"userns_base": 100000, "userns_size": 4294967296}'],
         'org.cowbox1.Error.InvalidJSON'),
        ('RunTask', ['base', "['/probe']", '{"userns_base": 100000, "userns_size": 0}'],
         'org.cowbox1.Error.InvalidJSON'),                                  # else no namespace: host root
        ('RunTask', ['base', "['/probe']", '{"hostname": "%s"}' % ('h' * 65)], 'org.cowbox1.Error.InvalidJSON'),
        ('CreateWorkspace', ['w', '{"image": "base", "owner": "4294967296"}'], 'org.cowbox1.Error.InvalidJSON'),
        ('ReceiveImageFromPath', ['/etc', '{}'], 'org.freedesktop.DBus.Error.InvalidArgs'),
        ('CancelJob', ['4242'], 'org.cowbox1.Error.NoSuchJob'),
        ('Snapshot', ['base'], 'org.freedesktop.DBus.Error.InvalidArgs'),   # a missing argument
        ('SetReadOnly', ['task', 'notabool'], None),                        # a wrong type
    ]
    for method, args, want in cases:
        r = d.gdbus_call(bus, method, *args, expect='fail')
        got = d.error_name(r)
        if want and got != want:
            t.fail(f'{method}{tuple(args)}: error {got}, expected {want}:\n{r.err}')
        t.check(len(r.err.strip()) > 20, f'{method}{tuple(args)} says why:\n{r.err}')
    t.check_equal(d.names(bus), before, 'subvolumes after the bad calls')


def check_cancel_and_crash(bus, daemon, store):
    before = d.names(bus)
    # A receive that waits on a pipe nobody writes the end of.
    read_end, write_end = os.pipe()
    stream = open(os.path.join(CORPUS, 'btrfs-v1-full'), 'rb').read()
    os.write(write_end, stream[:4096])
    client = subprocess.Popen([d.client_exe(), 'image', 'receive', 'stuck'], stdin=read_end,
                              env=dict(os.environ, **bus.env), stderr=subprocess.PIPE, text=True)
    os.close(read_end)
    deadline = time.monotonic() + 20
    jobs = []
    while not jobs and time.monotonic() < deadline:
        jobs = [j for j in json.loads(d.cowbox(bus, '--json', 'jobs').out) if j['type'] == 'receive']
        time.sleep(0.1)
    t.check(jobs, 'the receive shows as a job')
    rows = table_rows(d.cowbox(bus, 'jobs').out, ['ID', 'TYPE', 'STATE', 'PROGRESS', 'TARGET'])
    t.check([str(jobs[0]['id']), 'receive', 'stuck'] in [r[:2] + r[-1:] for r in rows],
            f'the receive in the table of cowbox jobs: {rows}')
    # The image being received is no object on the bus until it is one.
    d.wait_for('the receive\'s temporary subvolume',
               lambda: any(s['name'].startswith('.receiving-') for s in store.list()))
    tree = d.run(bus, ['busctl', '--system', 'tree', '--list', 'org.cowbox1']).out
    t.check('/org/cowbox1/subvolume/' in tree and '_2ereceiving' not in tree and '.receiving' not in tree,
            f'the objects on the bus during a receive:\n{tree}')
    d.cowbox(bus, 'cancel', str(jobs[0]['id']))
    _, err = client.communicate(timeout=30)
    t.check(client.returncode == 1 and 'cancelled' in err,
            f'the client of a cancelled receive: exit status {client.returncode}: {err}')
    os.close(write_end)
    # The cancelled job's clean-up may still be under way when the client
    # has its answer.
    deadline = time.monotonic() + 10
    while d.names(bus) != before and time.monotonic() < deadline:
        time.sleep(0.1)
    t.check_equal(d.names(bus), before, 'subvolumes after a cancelled receive')

    # kill -9 of the daemon while a receive is under way.
    read_end, write_end = os.pipe()
    os.write(write_end, stream[:8192])
    client = subprocess.Popen([d.client_exe(), 'image', 'receive', 'half'], stdin=read_end,
                              env=dict(os.environ, **bus.env), stderr=subprocess.DEVNULL)
    os.close(read_end)
    time.sleep(1.5)
    daemon.kill(signal.SIGKILL)
    client.wait(30)
    os.close(write_end)
    daemon.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        all_names = [s['name'] for s in store.list()]
        if not any(n.startswith('.receiving-') for n in all_names):
            break
        time.sleep(0.2)
    t.check_equal(sorted(s['name'] for s in store.list()), before,
                  'subvolumes (with temporary ones) after kill -9 during a receive and a restart')
    t.check_equal(d.names(bus), before, 'what the restarted daemon reports')


def check_job_limit(bus, store):
    """64 callers' jobs at once: the next is refused with TooManyJobs, and
    a delete still gets its reap job."""
    env = dict(os.environ, **bus.env)
    stream = open(os.path.join(CORPUS, 'btrfs-v1-full'), 'rb').read()
    pipes, clients = [], []
    try:
        for i in range(64):
            read_end, write_end = os.pipe()
            os.write(write_end, stream[:4096])
            clients.append(subprocess.Popen([d.client_exe(), 'image', 'receive', f'stuck{i}'], stdin=read_end,
                                            env=env, stderr=subprocess.DEVNULL))
            os.close(read_end)
            pipes.append(write_end)

        def jobs():
            return json.loads(d.cowbox(bus, '--json', 'jobs').out)

        d.wait_for('64 receive jobs', lambda: len(jobs()) == 64, timeout=60)
        r = d.gdbus_call(bus, 'Scrub', expect='fail')
        t.check_equal(d.error_name(r), 'org.cowbox1.Error.TooManyJobs', 'a 65th job')
        d.gdbus_call(bus, 'CreateSubvolume', 'doomed-at-the-limit')
        d.cowbox(bus, 'rm', 'doomed-at-the-limit')
        d.wait_for('the reap job of a delete at the job limit',
                   lambda: any(j['type'] == 'reap' for j in jobs()) or store.usage()['deleted_subvolumes'] == 0)
    finally:
        for c in clients:
            c.kill()
            c.wait()
        for w in pipes:
            os.close(w)
    d.wait_for('the jobs of callers that left to end', lambda: not json.loads(d.cowbox(bus, '--json', 'jobs').out),
               timeout=60)


def check_crash_while_reaping(bus, daemon, store):
    """kill -9 of the daemon while its reaper job runs: after a restart the
    space still comes back and the store checks out."""
    before = d.names(bus)
    for i in range(4):
        d.cowbox(bus, 'image', 'receive', '-f', os.path.join(CORPUS, 'btrfs-v1-full'), f'doomed{i}')
    store.run('reap', '--pause')
    for i in range(4):
        d.cowbox(bus, 'image', 'rm', f'doomed{i}')
    t.check(store.usage()['reclaimable_bytes'] > 0, 'space waits for the paused reaper')
    store.run('reap', '--resume')
    d.gdbus_call(bus, 'Reap')
    daemon.kill(signal.SIGKILL)
    daemon.start()
    deadline = time.monotonic() + 30
    while store.usage()['reclaimable_bytes'] > 0 and time.monotonic() < deadline:
        time.sleep(0.3)
    t.check_equal(store.usage()['reclaimable_bytes'], 0, 'reclaimable bytes after kill -9 during a reap')
    t.check_equal(d.names(bus), before, 'subvolumes after kill -9 during a reap')
    store.fsck()


def check_crash_creating_sandbox(bus, daemon, store):
    """kill -9 of the daemon while CreateSandbox saves its list: after a
    restart no snapshot is left under a sandbox's name that no sandbox
    names (no call could delete it, and the name could not be made
    again), and the sandbox can be made."""
    d.cowbox(bus, 'image', 'receive', '-f', os.path.join(CORPUS, 'btrfs-v1-full'), 'sbxcrash')
    records = store.path + '-sandboxes'
    os.makedirs(records, exist_ok=True)
    d.kill_while_saving(bus, daemon, os.path.join(records, '.sandboxes.json.tmp'),
                        ['sandbox', 'create', 'crashed', '--image', 'sbxcrash', '--', '/bin/true'])
    listed = json.loads(d.cowbox(bus, '--json', 'sandbox', 'list').out)
    if any(b['name'] == 'crashed' for b in listed):
        d.cowbox(bus, 'sandbox', 'rm', 'crashed')
    t.check_equal([n for n in store.names() if n.startswith('sbx-')], [],
                  'snapshots of sandboxes after kill -9 during CreateSandbox and a sandbox rm')
    d.cowbox(bus, 'sandbox', 'create', 'crashed', '--image', 'sbxcrash', '--', '/bin/true')

    # Killed once the list was saved, before the snapshot was made: the
    # sandbox is listed and can be removed.
    daemon.stop()
    state = os.path.join(records, '.sandboxes.json')
    listed = json.loads(t.read_file(state))
    listed.append(dict(listed[0], name='ghost'))
    t.write_file(state, json.dumps(listed).encode())
    daemon.start()
    # No signal announced its snapshot: none says it went.
    signals = d.signals_of(bus, lambda: d.cowbox(bus, 'sandbox', 'rm', 'ghost'))
    t.check('SubvolumeRemoved' not in signals and 'sbx_2dghost' not in signals,
            f'signals of the removal of a sandbox whose snapshot was never made:\n{signals}')
    d.cowbox(bus, 'sandbox', 'create', 'ghost', '--image', 'sbxcrash', '--', '/bin/true')
    for name in ('crashed', 'ghost'):
        d.cowbox(bus, 'sandbox', 'rm', name)
    d.cowbox(bus, 'image', 'rm', 'sbxcrash')
    store.fsck()


def reaper_settings(store):
    """The reapers' settings, as `reap --pause` prints them (the reapers are
    paused already where this is used)."""
    return store.json('reap', '--pause')


def check_reaper_marks(store):
    """With less free space than the low mark, the reaper's rate bound is
    lifted until the space is back; the reaper runs at a low I/O weight.
    kill -9 of the daemon in such a hurry leaves the rate that was set, and
    the hurry ends by itself."""
    with d.bus_and_daemon(store, args=['--reap-low-mark', '100', '--reap-high-mark', '100']) as (bus, daemon):
        store.run('reap', '--rate', '1')     # a byte a second: it would take forever
        for i in range(2):
            d.cowbox(bus, 'image', 'receive', '-f', os.path.join(CORPUS, 'btrfs-v1-full'), f'marks{i}')
        store.run('reap', '--pause')
        for i in range(2):
            d.cowbox(bus, 'image', 'rm', f'marks{i}')
        d.wait_for('the daemon to hurry the reapers', lambda: reaper_settings(store)['hurried'])
        t.check(d.gdbus_json(bus, 'GetStatus')['reaper']['urgent'], 'GetStatus says the reaper is in a hurry')
        status = d.cowbox(bus, 'status').out
        t.check(re.search(r'^Reaper backlog: +[0-9.]+ (B|[KMGT]iB) \(paused\) \(in a hurry: ', status, re.M),
                f'cowbox status of a paused reaper in a hurry:\n{status}')
        daemon.kill(signal.SIGKILL)
        t.check_equal(reaper_settings(store)['rate_bytes_per_sec'], 1,
                      'the rate set, after kill -9 of the daemon that hurried the reapers')
        d.wait_for('the hurry of the killed daemon to end by itself',
                   lambda: not reaper_settings(store)['hurried'], timeout=30)
        daemon.start()
        store.run('reap', '--resume')
        d.wait_for('the reaper to free the space below the low mark',
                   lambda: store.usage()['reclaimable_bytes'] == 0, timeout=60)
        d.wait_for('the rate bound to come back', lambda: not d.gdbus_json(bus, 'GetStatus')['reaper']['urgent'])
        status = d.gdbus_json(bus, 'GetStatus')['reaper']
        t.check_equal(status['rate_bytes_per_sec'], 1, 'the reaper\'s rate once the space is back')
        status = d.cowbox(bus, 'status').out
        t.check(re.search(r'^Reaper backlog: +0 B$', status, re.M), f'cowbox status once the space is back:\n{status}')
        r = json.loads(d.cowbox(bus, '--json', 'reap').out)
        t.check_equal(r['io_weight'], 10, 'the reaper\'s I/O weight')
        print(f'reaper cgroup: weight 10, not applied: {r["not_applied"]}', flush=True)
        store.run('reap', '--rate', '0')


def check_access(bus_contrib, store):
    nobody = d.ensure_user('cowbox-test-user')
    member = d.ensure_user('cowbox-test-member', groups=[d.POLICY_GROUP])
    # Anyone may look.
    d.gdbus_call(bus_contrib, 'ListImages', user=nobody)
    d.gdbus_call(bus_contrib, 'GetStatus', user=nobody)
    # Nobody else may change anything: the bus policy refuses.
    for method, args in (('CreateSubvolume', ['x']), ('Snapshot', ['base', 'x', '{}']),
                         ('DeleteSubvolume', ['task']), ('Scrub', []), ('Reap', []),
                         ('SetQuota', ['task', '1']), ('RemoveImage', ['base'])):
        r = d.gdbus_call(bus_contrib, method, *args, expect='fail', user=nobody)
        t.check('AccessDenied' in r.err, f'{method} as an unprivileged user:\n{r.err}')
    r = d.cowbox(bus_contrib, 'rm', 'task', expect=1, user=nobody)
    t.check('denied' in r.err.lower() or 'access' in r.err.lower(), f'cowbox rm as another user:\n{r.err}')
    # A member of the group may.
    d.gdbus_call(bus_contrib, 'Snapshot', 'base', 'by-member', '{}', user=member)
    d.gdbus_call(bus_contrib, 'DeleteSubvolume', 'by-member', user=member)
    return nobody


def check_daemon_refuses(store, nobody):
    """With a bus that lets everyone call everything, cowboxd refuses on
    its own."""
    with d.bus_and_daemon(store, policy='open') as (bus, daemon):
        for method, args in (('CreateSubvolume', ['x']), ('Snapshot', ['base', 'x', '{}']),
                             ('DeleteSubvolume', ['task']), ('Scrub', [])):
            r = d.gdbus_call(bus, method, *args, expect='fail', user=nobody)
            t.check_equal(d.error_name(r), 'org.cowbox1.Error.AccessDenied', f'{method} refused by cowboxd')
        t.check('x' not in d.names(bus), 'nothing was created by the refused calls')


def best_seconds(bus, argv, runs=5):
    best = None
    for _ in range(runs):
        start = time.monotonic()
        r = d.run(bus, argv, timeout=120)
        seconds = time.monotonic() - start
        best = seconds if best is None else min(best, seconds)
    return r, best


def check_managed_objects(bus, listed):
    """The object manager's listing of many subvolumes: each object's
    properties are those of the listing, and it costs about what the
    listing does: not a read of the subvolume a property, nor a walk of
    every stack for each."""
    call = ['busctl', '--system', '--json=short', 'call', 'org.cowbox1', '/org/cowbox1']
    r, managed = best_seconds(bus, call + ['org.freedesktop.DBus.ObjectManager', 'GetManagedObjects'])
    _, listing = best_seconds(bus, call + ['org.cowbox1.Manager', 'ListSubvolumes'])
    print(f'  GetManagedObjects {managed * 1000:.0f} ms, ListSubvolumes {listing * 1000:.0f} ms '
          f'for {len(listed)} subvolumes', flush=True)
    t.check(managed <= 4 * listing, f'GetManagedObjects took {managed:.3f} s, ListSubvolumes {listing:.3f} s')
    seen = {}
    for path, interfaces in json.loads(r.out)['data'][0].items():
        props = interfaces.get('org.cowbox1.Subvolume')
        if props:
            seen[props['Name']['data']] = {k: v['data'] for k, v in props.items()}
    t.check_equal(sorted(seen), sorted(listed), 'subvolume objects of GetManagedObjects')
    for name, props in seen.items():
        got = {'readonly': props['ReadOnly'], 'logical_bytes': props['LogicalBytes'],
               'exclusive_bytes': props['ExclusiveBytes'], 'uuid': props['UUID']}
        t.check_equal(got, {k: listed[name][k] for k in got}, f'properties of {name}')


def check_many_subvolumes(store):
    """A build farm's store holds many subvolumes: the daemon must not read
    them all while it waits (every few seconds it watches the free space),
    a listing reads each layer once and frozen ones without journal files,
    and the listing's figures are those that show gives one by one."""
    store.create('scale-work')
    with store.mount('scale-work') as m:
        t.write_file(m.p('base.c'), b'int base;\n' * 4096)
    store.snapshot('scale-work', 'scale-image', readonly=True)
    for i in range(MANY_SUBVOLUMES):
        store.snapshot('scale-image', f'scale{i:03}')
    with store.mount('scale007') as m:
        t.write_file(m.p('patch.c'), b'int patch;\n' * 8192)
    store.run('reap', '--wait')
    shown = {s['name']: s for s in store.list()}
    writable_tops = {str(s['top_layer']) for s in shown.values() if not s['readonly']}

    with d.bus_and_daemon(store) as (bus, daemon):
        watch = LayerWatch(store)
        try:
            # Two rounds of the daemon's watch of the free space, and of
            # its look for receives a crash left, which runs after a start.
            time.sleep(5)
            idle = watch.events()
            t.check_equal(idle, [], f'layer files the daemon opened while idle with {len(shown)} subvolumes')

            listed = json.loads(d.cowbox(bus, '--json', 'list').out)
            created = {LAYER_FILE.match(name).group(1) for mask, name in watch.events() if mask & IN_CREATE}
            t.check(created <= writable_tops,
                    f'cowbox list made journal files for frozen layers {sorted(created - writable_tops)}')
        finally:
            watch.close()

        t.check_equal(len(listed), len(shown), 'subvolumes listed')
        for entry in listed:
            if entry['name'] in ('scale-work', 'scale-image', 'scale000', 'scale007', 'base'):
                one = json.loads(d.cowbox(bus, '--json', 'show', entry['name']).out)
                t.check_equal(entry, one, f'cowbox list and cowbox show of {entry["name"]}')
        by_name = {e['name']: e for e in listed}
        t.check(by_name['scale007']['exclusive_bytes'] > by_name['scale000']['exclusive_bytes'],
                f'the written snapshot holds bytes of its own: {by_name["scale007"]} against {by_name["scale000"]}')
        check_managed_objects(bus, by_name)

        for name in ['scale-work', 'scale-image'] + [f'scale{i:03}' for i in range(MANY_SUBVOLUMES)]:
            store.delete(name, reap=False)
        store.run('reap', '--wait')


def check_second_daemon(bus, daemon, store):
    """A second cowboxd on a store that one serves, on the same bus or on
    another, refuses at once and names the first; the first serves on."""
    other = d.Bus(store)
    try:
        for what, b in (('the same bus', bus), ('another bus', other)):
            start = time.monotonic()
            p = d.run_daemon_to_exit(store, b)
            t.check(p.returncode != 0 and f'another cowboxd (PID {daemon.proc.pid}) serves the store' in p.stderr,
                    f'a second cowboxd on {what}: exit {p.returncode}\n{p.stderr}')
            t.check(time.monotonic() - start < 10, f'a second cowboxd on {what} took {time.monotonic() - start:.1f} s '
                    'to give up')
    finally:
        other.stop()
    d.cowbox(bus, 'status')


def own_identity(pidns):
    """This process as a claim of the store names its daemon."""
    with open('/proc/self/stat') as f:
        start_time = f.read().rsplit(')', 1)[1].split()[19]
    with open('/proc/sys/kernel/random/boot_id') as f:
        boot_id = f.read().strip()
    return f'{os.getpid()} {start_time} {boot_id} {pidns}\n'


def check_claim_of_another_namespace(store):
    """The claim of a daemon of another PID namespace, whose PID means
    nothing here (a container's daemon is restarted in a new one), is
    taken over, and says so; one of this namespace whose process runs is
    not."""
    claim = os.path.join(store.path + '-sandboxes', '.cowboxd')
    own_ns = os.stat('/proc/self/ns/pid').st_ino
    t.write_file(claim, own_identity(own_ns + 1).encode())
    with d.bus_and_daemon(store) as (bus, daemon):
        d.cowbox(bus, 'status')
    log = open(daemon.log).read()
    t.check(f'another PID namespace (PID {os.getpid()} there); taking it over' in log,
            f'cowboxd on the claim of another namespace:\n{log[-2000:]}')
    t.write_file(claim, own_identity(own_ns).encode())
    p = d.run_daemon_to_exit(store)
    t.check(p.returncode != 0 and f'another cowboxd (PID {os.getpid()}) serves the store' in p.stderr,
            f'cowboxd on the claim of a process that runs: exit {p.returncode}\n{p.stderr}')
    os.unlink(claim)


def run():
    d.require_dbus()
    t.require_program('setpriv')
    with t.Store('daemon') as store:
        usage_before = store.usage()
        with d.bus_and_daemon(store) as (bus, daemon):
            check_standard_clients(bus, store)
            check_jobs_and_objects(bus, store)
            check_receive_progress(bus, store)
            check_bad_arguments(bus, store)
            check_cancel_and_crash(bus, daemon, store)
            check_job_limit(bus, store)
            check_crash_while_reaping(bus, daemon, store)
            check_crash_creating_sandbox(bus, daemon, store)
            check_second_daemon(bus, daemon, store)
            nobody = check_access(bus, store)
        check_daemon_refuses(store, nobody)
        check_reaper_marks(store)
        check_bus_without_policy(store)
        check_claim_of_another_namespace(store)
        check_many_subvolumes(store)

        # Everything goes; the reaper gives the space back.
        with d.bus_and_daemon(store) as (bus, daemon):
            for name in d.names(bus):
                d.cowbox(bus, 'rm', name)
            d.cowbox(bus, 'reap')
            deadline = time.monotonic() + 30
            while store.usage()['reclaimable_bytes'] > 0 and time.monotonic() < deadline:
                d.cowbox(bus, 'reap')
                time.sleep(0.5)
        after = store.usage()
        t.check_equal(after['reclaimable_bytes'], 0, 'reclaimable bytes at the end')
        t.check_equal(after['logical_bytes'], usage_before['logical_bytes'], 'logical bytes at the end')
        t.check_equal(after['data_bytes'], usage_before['data_bytes'], 'data bytes at the end')
        store.fsck()


if __name__ == '__main__':
    t.main(run)
