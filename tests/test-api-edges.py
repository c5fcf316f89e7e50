#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""cowboxd at the edges of its API, on a private system bus: a task's
output with NULs and cut in the middle of a character, options refused at
the call rather than inside the job, damaged state files, waiters of one
caller and of one unprivileged user, a workspace beside a task, the
signals of every job, a task whose caller left at once, a name that is
not UTF-8, the object manager's signals, jobs whose error or result
quotes such a name, a kill that comes after the run ended, a sandbox
whose run died with the daemon, the cowbox client's usage errors, and a
subvolume whose record in the catalog is damaged."""

import glob
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import MiB  # noqa: E402
import daemon_test as d  # noqa: E402
import stream_test as st  # noqa: E402

WORKDIR = '/tmp/w'      # under the task's private /tmp


def make_image(bus, name='base'):
    d.gdbus_call(bus, 'CreateSubvolume', name)
    d.gdbus_call(bus, 'SetReadOnly', name, 'true')


def run_json(bus, *command, expect=0):
    r = d.cowbox(bus, '--json', 'run', '--workdir', WORKDIR, 'base', '--', *command, expect=expect)
    return json.loads(r.out)


def check_nul_output(bus):
    """A task's NUL bytes are in its result, for run and for a sandbox."""
    report = run_json(bus, '/usr/bin/printf', 'a\\0b\\n')
    t.check_equal(report['stdout'], 'a\0b\n', 'the output of a task that writes a NUL')
    r = d.run(bus, [d.client_exe(), 'run', '--workdir', WORKDIR, 'base', '--', '/usr/bin/printf', 'a\\0b\\n'])
    t.check_equal(r.out, 'a\0b\n', 'cowbox run prints a NUL of the output')
    d.cowbox(bus, 'sandbox', 'create', 'nul', '--image', 'base', '--workdir', WORKDIR, '--',
             '/usr/bin/printf', 'a\\0b\\n')
    d.cowbox(bus, 'sandbox', 'start', 'nul')
    doc = json.loads(d.cowbox(bus, '--json', 'sandbox', 'wait', 'nul').out)
    t.check(doc['result'] is not None and doc['result']['stdout'] == 'a\0b\n',
            f'the result of a sandbox whose task wrote a NUL: {doc}')
    r = d.cowbox(bus, 'sandbox', 'wait', 'nul')
    t.check_equal(r.out, 'a\0b\n', 'cowbox sandbox wait prints a NUL of the output')
    d.cowbox(bus, 'sandbox', 'rm', 'nul')


def check_output_characters(bus):
    """Output cut at 64 KiB in the middle of a character keeps every whole
    character before it; only invalid bytes are replaced, each invalid
    sequence by one U+FFFD."""
    script = 'head -c 65535 /dev/zero | tr "\\0" a; printf "\\303\\251\\303\\251"'
    report = run_json(bus, '/bin/sh', '-c', script)
    t.check_equal(report['stdout'], 'a' * 65535, 'an output cut in the middle of a character')
    script = 'head -c 65534 /dev/zero | tr "\\0" a; printf "\\342\\202\\254"'
    report = run_json(bus, '/bin/sh', '-c', script)
    t.check_equal(report['stdout'], 'a' * 65534, 'an output cut in the middle of a three-byte character')
    report = run_json(bus, '/usr/bin/printf',
                      'ok \\303\\251 \\377 \\342\\202 \\300\\257 \\355\\240\\200 \\360\\237\\231\\202')
    t.check_equal(report['stdout'], 'ok \u00e9 \ufffd \ufffd \ufffd\ufffd \ufffd\ufffd\ufffd \U0001f642',
                  'an output with invalid UTF-8 sequences')


def check_disk_limit(bus, store):
    """disk_max: a task's snapshot may grow by that much (EDQUOT past it);
    a sandbox's runs together."""
    report = run_json(bus, '/bin/sh', '-c', f'head -c 4194304 /dev/urandom > {WORKDIR}/big || echo refused',
                      expect=None)
    t.check_equal(report['stdout'], '', 'a task writing 4 MiB without a disk limit')
    r = d.cowbox(bus, '--json', 'run', '--disk-max', '1M', '--workdir', WORKDIR, 'base', '--', '/bin/sh', '-c',
                 f'head -c 4194304 /dev/urandom > {WORKDIR}/big || echo refused', expect=None)
    report = json.loads(r.out)
    t.check('Disk quota exceeded' in report['stderr'] and report['stdout'] == 'refused\n',
            f'a task writing 4 MiB under --disk-max 1M: {report}')
    d.cowbox(bus, 'sandbox', 'create', 'limited', '--image', 'base', '--disk-max', '3M', '--', '/bin/true')
    t.check_equal(store.show('sbx-limited')['quota_bytes'], store.show('base')['logical_bytes'] + 3 * MiB,
                  'the quota of a sandbox made with --disk-max 3M')
    d.cowbox(bus, 'sandbox', 'rm', 'limited')

    # A growth past the largest quota the store holds (2^63 - 1) is no
    # limit in effect, not an error.
    d.cowbox(bus, 'snapshot', 'base', 'grown')
    with store.mount('grown') as m:
        with open(m.p('file'), 'w') as f:
            f.write('x' * 5000)
    d.gdbus_call(bus, 'SetReadOnly', 'grown', 'true')
    d.gdbus_call(bus, 'CreateSandbox', 'unlimited', 'grown', "['/bin/true']", json.dumps({'disk_max': 2**63 - 1}))
    t.check_equal(store.show('sbx-unlimited')['quota_bytes'], 2**63 - 1,
                  'the quota of a sandbox whose disk_max is 2^63 - 1')
    d.cowbox(bus, 'sandbox', 'rm', 'unlimited')
    d.cowbox(bus, 'rm', 'grown')


def refused(bus, method, *args, error='org.cowbox1.Error.InvalidJSON', what=''):
    """A call refused with the error named, a sentence, and no job started."""
    r = d.gdbus_call(bus, method, *args, expect='fail')
    t.check_equal(d.error_name(r), error, f'the error of {method} {what}: {r.err}')
    t.check(len(r.err.split(':', 2)[-1].strip()) > 10, f'the error of {method} {what} has a sentence: {r.err}')
    t.check_equal(json.loads(d.cowbox(bus, '--json', 'jobs').out), [], f'jobs after {method} {what}')
    return r


def check_task_options(bus):
    """Options a task could not run with are refused at the call."""
    huge = 18446744073709556
    r = refused(bus, 'RunTask', 'base', "['/bin/true']", json.dumps({'cpu_percent': huge}), what='with a huge cpu')
    t.check('cpu_percent' in r.err, f'the error names the option: {r.err}')
    refused(bus, 'CreateSandbox', 'cpu', 'base', "['/bin/true']", json.dumps({'cpu_percent': huge}),
            what='with a huge cpu')
    d.cowbox(bus, 'run', '--cpu', str(huge), '--workdir', WORKDIR, 'base', '--', '/bin/true', expect=1)
    d.cowbox(bus, 'run', '--cpu', '50', '--workdir', WORKDIR, 'base', '--', '/bin/true')
    # An image that is not there, like CreateSandbox's.
    refused(bus, 'RunTask', 'no-such-image', "['/bin/true']", '{}', error='org.cowbox1.Error.NoSuchSubvolume',
            what='of a missing image')
    r = d.cowbox(bus, 'run', '--workdir', WORKDIR, 'no-such-image', '--', '/bin/true', expect=1)
    t.check("'no-such-image'" in r.err and 'sandbox-' not in r.err, f'cowbox run of a missing image:\n{r.err}')

    for opts, key in (({'userns_base': 4294901760}, 'userns'),       # 2^32 - 65536: the default size is too many
                      ({'userns_base': 4000000000, 'userns_size': 300000000}, 'userns'),
                      ({'workdir': '/'}, 'workdir'), ({'workdir': '//'}, 'workdir'), ({'workdir': '/./'}, 'workdir'),
                      ({'cwd': '../../etc'}, 'cwd'), ({'cwd': 'etc'}, 'cwd'), ({'cwd': '/tmp/../etc'}, 'cwd'),
                      ({'cwd': '/tmp/./x'}, 'cwd')):
        for method, args in (('RunTask', ('base',)), ('CreateSandbox', ('opts', 'base'))):
            r = refused(bus, method, *args, "['/bin/true']", json.dumps(opts), what=f'with {opts}')
            t.check(key in r.err, f'the error of {method} with {opts} names the option: {r.err}')
    # An image being received is no source: what it holds is not whole yet.
    refused(bus, 'RunTask', '.receiving-1-0', "['/bin/true']", '{}', error='org.cowbox1.Error.InvalidName',
            what='of an image being received')
    refused(bus, 'CreateSandbox', 'partial', '.receiving-1-0', "['/bin/true']", '{}',
            error='org.cowbox1.Error.InvalidName', what='of an image being received')
    t.check_equal(json.loads(d.cowbox(bus, '--json', 'sandbox', 'list').out), [], 'sandboxes after the refusals')
    report = run_json(bus, '/bin/pwd')
    t.check_equal(report['stdout'], WORKDIR + '\n', 'the working directory of a task by default')
    # Only whole components are refused: "..w" is a name like any other.
    report = json.loads(d.cowbox(bus, '--json', 'run', '--workdir', '/tmp/..w', 'base', '--', '/bin/pwd').out)
    t.check_equal(report['stdout'], '/tmp/..w\n', 'a task whose working tree\'s name starts with ".."')
    r = d.gdbus_call(bus, 'RunTask', 'base', "['/bin/true']", json.dumps({'userns_base': 4294901758}))
    t.check('/org/cowbox1/job/' in r.out, f'a user namespace whose last ID is 2^32 - 2 is taken: {r.out}')
    d.wait_for('the task to end', lambda: json.loads(d.cowbox(bus, '--json', 'jobs').out) == [])

    d.gdbus_call(bus, 'CreateSubvolume', 'writable')
    with open('/dev/null', 'w') as null:
        env = dict(os.environ, **bus.env)
        for name, opts, error in (('nothing', '{}', 'NoSuchImage'), ('writable', '{}', 'NotReadOnly'),
                                  ('base', '{"parent": "nothing"}', 'NoSuchImage'),
                                  ('base', '{"version": 1, "compressed_data": true}', 'InvalidJSON')):
            p = subprocess.run(['gdbus', 'call', '--system', '--dest', 'org.cowbox1', '--object-path', '/org/cowbox1',
                                '--method', 'org.cowbox1.Manager.SendImage', name, '1', opts], env=env,
                               stdin=null, capture_output=True, text=True)
            t.check(p.returncode != 0 and f'org.cowbox1.Error.{error}' in p.stderr,
                    f'SendImage of {name} with {opts}: {p.returncode} {p.stderr}')
    r = d.cowbox(bus, 'image', 'send', '-f', '/dev/null', 'nothing', expect=1)
    t.check('no image named' in r.err, f'cowbox image send of no image: {r.err}')
    r = d.cowbox(bus, 'image', 'send', '--proto', '1', '--compressed-data', '-f', '/dev/null', 'base', expect=2)
    t.check('--proto 2' in r.err, f'cowbox image send --proto 1 --compressed-data: {r.err}')
    t.check_equal(json.loads(d.cowbox(bus, '--json', 'jobs').out), [], 'jobs after the sends refused')
    d.cowbox(bus, 'rm', 'writable')


def check_damaged_state(store):
    """A damaged list of workspaces or sandboxes keeps the daemon from
    starting, with a message naming the file and the damage; the file is
    left as it was, never replaced by an empty list."""
    for path, listed in ((store.path + '-workspaces/.workspaces.json', 'workspaces'),
                         (store.path + '-sandboxes/.sandboxes.json', 'sandboxes')):
        with open(path, 'rb') as f:
            good = f.read()
        damaged = good[:len(good) // 2] + b'\x00garbage'
        with open(path, 'wb') as f:
            f.write(damaged)
        p = d.run_daemon_to_exit(store)
        t.check(p.returncode != 0, f'cowboxd started with a damaged {path}: {p.stderr}')
        t.check(path in p.stderr and f'list of {listed}' in p.stderr and re.search(r'line \d+, column \d+', p.stderr)
                and 'Structure needs cleaning' not in p.stderr, f'what cowboxd says of a damaged {path}:\n{p.stderr}')
        with open(path, 'rb') as f:
            t.check_equal(f.read(), damaged, f'{path} after cowboxd refused it')
        with open(path, 'wb') as f:
            f.write(good)


class RawBus:
    """One connection to the bus, spoken by hand: many calls at once from
    one caller, which no standard client makes."""

    def __init__(self, bus):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(bus.socket)
        self.sock.sendall(b'\0AUTH EXTERNAL ' + str(os.getuid()).encode().hex().encode() + b'\r\n')
        t.check(self.sock.recv(4096).startswith(b'OK'), 'the bus accepts the raw connection')
        self.sock.sendall(b'BEGIN\r\n')
        self.serial = 0
        self.call('org.freedesktop.DBus', '/org/freedesktop/DBus', 'org.freedesktop.DBus', 'Hello')

    @staticmethod
    def _pad(buf, n):
        return buf + b'\0' * (-len(buf) % n)

    def call(self, dest, path, interface, member, arg=None):
        body = b''
        if arg is not None:
            body = struct.pack('<I', len(arg.encode())) + arg.encode() + b'\0'
        fields = b''
        header_fields = [(1, 'o', path), (2, 's', interface), (3, 's', member), (6, 's', dest)]
        if arg is not None:
            header_fields.append((8, 'g', 's'))
        for code, sig, value in header_fields:
            fields = self._pad(fields, 8) + bytes([code, 1]) + sig.encode() + b'\0'
            if sig == 'g':
                fields += bytes([len(value)]) + value.encode() + b'\0'
            else:
                fields = self._pad(fields, 4) + struct.pack('<I', len(value.encode())) + value.encode() + b'\0'
        self.serial += 1
        header = b'l\x01\x00\x01' + struct.pack('<III', len(body), self.serial, len(fields)) + fields
        self.sock.sendall(self._pad(header, 8) + body)

    def received(self, seconds):
        """What came in within seconds, raw."""
        data = b''
        self.sock.settimeout(0.2)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                data += self.sock.recv(1 << 16)
            except socket.timeout:
                pass
        return data

    def close(self):
        self.sock.close()


def check_waiters_of_one_caller(bus):
    """One caller cannot take every place of a sandbox's waiters: its calls
    past its share are refused, and another caller still waits."""
    d.cowbox(bus, 'sandbox', 'create', 'waited', '--image', 'base', '--workdir', WORKDIR, '--', '/bin/sleep', '60')
    d.cowbox(bus, 'sandbox', 'start', 'waited')
    raw = RawBus(bus)
    for _ in range(70):
        raw.call('org.cowbox1', '/org/cowbox1', 'org.cowbox1.Manager', 'WaitSandbox', 'waited')
    refusals = raw.received(2).count(b'org.cowbox1.Error.Busy')
    t.check(60 <= refusals < 70, f'one caller\'s 70 waits: {refusals} refused')
    env = dict(os.environ, **bus.env)
    waiter = subprocess.Popen([d.client_exe(), 'sandbox', 'wait', 'waited'], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    d.cowbox(bus, 'sandbox', 'kill', 'waited')
    _, err = waiter.communicate(timeout=60)
    # On a loaded machine the kill can come before the task runs: a
    # sandbox killed without a result is an answer too.
    t.check('Too many' not in err and ('exit status' in err or "'waited' killed without a result" in err),
            f'a wait beside a caller that waits many times:\n{err}')
    replies = raw.received(1)
    t.check(b'"state":"killed"' in replies, 'the waits of the raw caller are answered')
    raw.close()
    d.cowbox(bus, 'sandbox', 'rm', 'waited')


def check_waiters_of_unprivileged(bus):
    """Anyone may wait for a sandbox: a user who may not change the store
    takes one caller's share of the places however many connections they
    open, and root can still wait."""
    uid, gid, _ = d.ensure_user('cowbox-test-user')
    d.cowbox(bus, 'sandbox', 'create', 'watched', '--image', 'base', '--workdir', WORKDIR, '--', '/bin/sleep', '60')
    d.cowbox(bus, 'sandbox', 'start', 'watched')
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(done_w)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            callers = [RawBus(bus) for _ in range(9)]
            for raw in callers:
                for _ in range(8):
                    raw.call('org.cowbox1', '/org/cowbox1', 'org.cowbox1.Manager', 'WaitSandbox', 'watched')
            refusals = sum(raw.received(0.5).count(b'org.cowbox1.Error.Busy') for raw in callers)
            os.write(ready_w, str(refusals).encode())
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        refusals = int(os.read(ready_r, 64) or b'-1')
        t.check_equal(refusals, 64, 'the refusals of 72 waits of one unprivileged user on 9 connections')
        d.run(bus, ['timeout', '3', d.client_exe(), 'sandbox', 'wait', 'watched'], expect=124)
    finally:
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)
    d.cowbox(bus, 'sandbox', 'kill', 'watched')
    d.cowbox(bus, 'sandbox', 'wait', 'watched', expect=None)
    d.cowbox(bus, 'sandbox', 'rm', 'watched')


def check_workspace_beside_task(bus):
    """A task of the workdir shape sees the host without the store's mounts:
    a workspace mounted before it started shows it nothing, and is removed
    at once while the task runs (a copy of its mount in the task's view kept
    its server alive: the removal waited, then failed as busy)."""
    d.cowbox(bus, 'workspace', 'create', 'beside', '--image', 'base')
    path = json.loads(d.cowbox(bus, '--json', 'workspace', 'show', 'beside').out)['path']
    with open(os.path.join(path, 'seen'), 'w') as f:
        f.write('private\n')
    env = dict(os.environ, **bus.env)
    task = subprocess.Popen([d.client_exe(), '--json', 'run', '--workdir', WORKDIR, 'base', '--', '/bin/sh', '-c',
                             f'ls -A {path}; sleep 20'], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        d.wait_for('the task to start', lambda: json.loads(d.cowbox(bus, '--json', 'jobs').out))
        time.sleep(3)
        start = time.monotonic()
        d.cowbox(bus, 'workspace', 'rm', 'beside')
        t.check(time.monotonic() - start < 5, f'the removal of a workspace beside a task took '
                f'{time.monotonic() - start:.1f}s')
    finally:
        out, err = task.communicate(timeout=60)
    t.check_equal(json.loads(out)['stdout'], '', f'what a task saw of a workspace ({err})')


def check_signals(bus):
    """Every job is announced by JobNew, also the reaps the daemon starts
    itself; the subvolumes of sandboxes and workspaces come and go with
    their signals."""
    d.wait_for('the jobs before to end', lambda: json.loads(d.cowbox(bus, '--json', 'jobs').out) == [])
    env = dict(os.environ, **bus.env)
    monitor = subprocess.Popen(['gdbus', 'monitor', '--system', '--dest', 'org.cowbox1'], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        time.sleep(1)
        d.gdbus_call(bus, 'CreateSubvolume', 'doomed')
        d.cowbox(bus, 'rm', 'doomed')
        d.cowbox(bus, 'sandbox', 'create', 'signalled', '--image', 'base', '--', '/bin/true')
        d.cowbox(bus, 'sandbox', 'rm', 'signalled')
        d.cowbox(bus, 'workspace', 'create', 'sig', '--image', 'base')
        d.cowbox(bus, 'workspace', 'checkpoint', 'sig', 'one')
        d.cowbox(bus, 'workspace', 'rm', 'sig')
        d.wait_for('the jobs to end', lambda: json.loads(d.cowbox(bus, '--json', 'jobs').out) == [])
        time.sleep(1)
    finally:
        monitor.terminate()
        out, _ = monitor.communicate(timeout=30)
    new = set(re.findall(r'\.JobNew \(uint32 (\d+),', out))
    removed = set(re.findall(r'\.JobRemoved \(uint32 (\d+),', out))
    t.check(removed and removed <= new, f'JobNew of every job that ended (new {new}, removed {removed}):\n{out}')
    for member, name in (('SubvolumeNew', 'doomed'), ('SubvolumeRemoved', 'doomed'),
                         ('SubvolumeNew', 'sbx-signalled'), ('SubvolumeRemoved', 'sbx-signalled'),
                         ('SubvolumeNew', 'workspace-sig'), ('SubvolumeNew', 'workspace-sig@one'),
                         ('SubvolumeRemoved', 'workspace-sig'), ('SubvolumeRemoved', 'workspace-sig@one')):
        t.check(f".{member} ('{name}'," in out, f'{member} of {name}:\n{out}')


def check_wait_unstarted(bus):
    """Waiting for a sandbox never started says to start it."""
    d.cowbox(bus, 'sandbox', 'create', 'unstarted', '--image', 'base', '--workdir', WORKDIR, '--', '/bin/true')
    r = d.cowbox(bus, 'sandbox', 'wait', 'unstarted', expect=1)
    t.check("has not been started" in r.err and "cowbox sandbox start unstarted" in r.err,
            f'cowbox sandbox wait of a sandbox never started:\n{r.err}')
    d.cowbox(bus, 'sandbox', 'rm', 'unstarted')


def check_client_usage(bus, daemon):
    """The client's usage errors say what is wrong (exit status 2), and a
    wait whose daemon goes away exits with 69, as for a daemon that is not
    there."""
    for argv, words in ((['sandbox', 'create'], ['NAME']),
                        (['sandbox', 'create', 'x', '--image', 'base', '--keep', '--', '/bin/true'], ['--keep', 'run']),
                        (['sandbox', 'create', 'x', '--image', 'base', '--name', 'y', '--', '/bin/true'],
                         ['--name', 'run']),
                        (['run', '--timeout', '-1', 'base', '--', '/bin/true'], ['-1']),
                        (['run', '--memory-max', '-5', 'base', '--', '/bin/true'], ['-5']),
                        (['workspace'], ['no workspace command', 'create', 'rm']),
                        (['sandbox'], ['no sandbox command', 'create', 'wait']),
                        (['image'], ['no image command', 'receive', 'send'])):
        r = d.cowbox(bus, *argv, expect=2)
        t.check(all(w in r.err for w in words), f'cowbox {" ".join(argv)} says {words}:\n{r.err}')
    t.check_equal(json.loads(d.cowbox(bus, '--json', 'sandbox', 'list').out), [], 'sandboxes after usage errors')
    t.check('--keep' in d.cowbox(bus, '--help').out.split('sandbox create', 1)[1].split('sandbox start')[0],
            'the help of sandbox create says which options of run it takes')

    d.cowbox(bus, 'sandbox', 'create', 'orphan', '--image', 'base', '--workdir', WORKDIR, '--', '/bin/sleep', '60')
    d.cowbox(bus, 'sandbox', 'start', 'orphan')
    env = dict(os.environ, **bus.env)
    waiter = subprocess.Popen([d.client_exe(), 'sandbox', 'wait', 'orphan'], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    daemon.kill(signal.SIGTERM)
    _, err = waiter.communicate(timeout=60)
    t.check(waiter.returncode == 69 and 'cowboxd exited' in err,
            f'a wait whose daemon went away: exit status {waiter.returncode}:\n{err}')
    daemon.start()
    d.cowbox(bus, 'sandbox', 'rm', 'orphan')


def children(pid):
    """The PIDs of the processes whose parent is pid."""
    found = set()
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open(f'/proc/{entry}/stat') as f:
                    if int(f.read().rsplit(')', 1)[1].split()[1]) == pid:
                        found.add(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found


def check_caller_gone_at_once(bus, daemon, store):
    """A RunTask whose caller leaves the bus while the daemon starts its job
    (before it watches the caller) is cancelled as when the caller leaves
    later: the task does not run on without its caller. strace holds the
    daemon in the return of its fork of the job's worker meanwhile."""
    t.require_program('strace')
    env = dict(os.environ, **bus.env)
    log = os.path.join(store.tmp, 'monitor.log')
    pid = daemon.proc.pid
    before = children(pid)
    with open(log, 'w') as out:
        # Line by line: the test reads the log while gdbus runs.
        monitor = subprocess.Popen(['stdbuf', '-oL', 'gdbus', 'monitor', '--system', '--dest', 'org.cowbox1'],
                                   env=env, stdout=out, stderr=subprocess.DEVNULL)
    tracer = subprocess.Popen(['strace', '-qq', '-o', '/dev/null', '-p', str(pid), '-e', 'trace=clone,clone3',
                               '-e', 'inject=clone,clone3:delay_exit=2000000'], stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)
        caller = subprocess.Popen(['gdbus', 'call', '--system', '--dest', 'org.cowbox1', '--object-path',
                                   '/org/cowbox1', '--method', 'org.cowbox1.Manager.RunTask', 'base',
                                   "['/bin/sleep', '60']", json.dumps({'workdir': WORKDIR})], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        d.wait_for('the worker of the task', lambda: children(pid) - before)
        caller.kill()
        caller.wait()
        d.wait_for('the task whose caller left to be cancelled',
                   lambda: re.search(r"\.JobRemoved \(uint32 \d+, objectpath '[^']*', 'cancelled'", open(log).read()),
                   timeout=20)
    finally:
        tracer.terminate()
        tracer.wait(30)
        monitor.terminate()
        monitor.wait(30)
    t.check_equal(d.names(bus), ['base'], 'subvolumes after the task whose caller left')


def check_name_not_utf8(bus, store):
    """A subvolume whose name is not UTF-8 (cowbox-store and btrfs streams
    take any bytes but '/' and control characters) is listed with U+FFFD
    for the bytes D-Bus and JSON cannot carry; the other subvolumes are
    listed all the same, and its object answers. A receive of one says
    what it received."""
    name = b'odd-\xff\xc3'.decode('utf-8', 'surrogateescape')
    store.run('subvolume', 'create', name)
    try:
        listed = d.names(bus)
        t.check('odd-\ufffd\ufffd' in listed and 'base' in listed,
                f'cowbox list with a name that is not UTF-8: {listed}')
        images = json.loads(d.cowbox(bus, '--json', 'image', 'list').out)
        t.check([i['name'] for i in images] == ['base'], f'cowbox image list beside it: {images}')
        r = d.gdbus_call(bus, 'GetManagedObjects', interface='org.freedesktop.DBus.ObjectManager')
        t.check("'Name': <'odd-\ufffd\ufffd'>" in r.out and "'Name': <'base'>" in r.out,
                f'GetManagedObjects with a name that is not UTF-8: {r.out[:2000]}')
    finally:
        store.run('subvolume', 'delete', name)

    # One received: its result names it so, and its object by its path,
    # which SubvolumeNew gives too.
    stream = os.path.join(store.tmp, 'odd-name.stream')
    with open(stream, 'wb') as f:
        f.write(st.simple_stream(name=b'img-\xff', uuid=b'\x33' * 16))
    env = dict(os.environ, **bus.env)
    log = os.path.join(store.tmp, 'odd-name.log')
    with open(log, 'w') as out:
        monitor = subprocess.Popen(['stdbuf', '-oL', 'gdbus', 'monitor', '--system', '--dest', 'org.cowbox1'],
                                   env=env, stdout=out, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)
        result = json.loads(d.cowbox(bus, '--json', 'image', 'receive', '-f', stream).out)
        t.check_equal(result, {'images': ['img-\ufffd'], 'paths': ['/org/cowbox1/subvolume/img_2d_ff']},
                      'the result of receiving an image whose name is not UTF-8')
        d.wait_for('SubvolumeNew of it', lambda: "('img-\ufffd', objectpath '/org/cowbox1/subvolume/img_2d_ff')"
                   in open(log).read())
    finally:
        monitor.terminate()
        monitor.wait(30)
        store.run('subvolume', 'delete', b'img-\xff'.decode('utf-8', 'surrogateescape'))


def managed_objects(bus):
    """The object paths GetManagedObjects names."""
    out = d.gdbus_call(bus, 'GetManagedObjects', interface='org.freedesktop.DBus.ObjectManager').out
    # GVariant's text names the type of the first key only.
    return set(re.findall(r"(?:objectpath )?'(/org/cowbox1/[^']*)': \{", out))


def check_object_manager_signals(bus, store):
    """The object manager announces every object that comes and goes
    (subvolumes, a task's snapshot it keeps and a workspace's restored
    state too, jobs, sandboxes) with InterfacesAdded and
    InterfacesRemoved: a client that follows them from
    GetManagedObjects knows the objects that GetManagedObjects names
    later."""
    d.wait_for('the jobs before to end', lambda: json.loads(d.cowbox(bus, '--json', 'jobs').out) == [])
    env = dict(os.environ, **bus.env)
    log = os.path.join(store.tmp, 'object-manager.log')
    with open(log, 'w') as out:
        monitor = subprocess.Popen(['stdbuf', '-oL', 'gdbus', 'monitor', '--system', '--dest', 'org.cowbox1'],
                                   env=env, stdout=out, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)
        known = managed_objects(bus)
        d.gdbus_call(bus, 'CreateSubvolume', 'om-1')
        d.gdbus_call(bus, 'Rename', 'om-1', 'om-2')
        d.cowbox(bus, 'snapshot', 'om-2', 'om-3')
        d.cowbox(bus, 'rm', 'om-2')
        d.cowbox(bus, 'sandbox', 'create', 'om', '--image', 'base', '--workdir', WORKDIR, '--', '/bin/true')
        d.cowbox(bus, 'sandbox', 'start', 'om')
        d.cowbox(bus, 'sandbox', 'wait', 'om')
        d.cowbox(bus, 'sandbox', 'rm', 'om')
        d.cowbox(bus, 'run', '--keep', '--name', 'om-kept', '--workdir', WORKDIR, 'base', '--', '/bin/true')
        d.cowbox(bus, 'workspace', 'create', 'omw', '--image', 'base')
        d.cowbox(bus, 'workspace', 'checkpoint', 'omw', 'one')
        d.cowbox(bus, 'workspace', 'restore', 'omw', 'one')
        d.cowbox(bus, 'workspace', 'rm', 'omw')
        d.wait_for('the jobs to end', lambda: json.loads(d.cowbox(bus, '--json', 'jobs').out) == [])
        time.sleep(1)
    finally:
        monitor.terminate()
        monitor.wait(30)
    signals = re.findall(r"\.Interfaces(Added|Removed) \(objectpath '([^']*)'", open(log).read())
    # A restore replaces the workspace's subvolume by another (another
    # UUID) of the same name.
    t.check_equal(signals.count(('Added', '/org/cowbox1/subvolume/workspace_2domw')), 2,
                  'InterfacesAdded of a workspace created and restored')
    t.check_equal(signals.count(('Removed', '/org/cowbox1/subvolume/workspace_2domw')), 2,
                  'InterfacesRemoved of a workspace restored and removed')
    added, removed = set(), set()
    for kind, path in signals:
        if kind == 'Added':
            known.add(path)
            added.add(path)
        else:
            known.discard(path)
            removed.add(path)
    prefix = '/org/cowbox1/'
    for path in ('subvolume/om_2d1', 'subvolume/om_2d2', 'subvolume/sbx_2dom', 'sandbox/om'):
        t.check(prefix + path in added and prefix + path in removed,
                f'InterfacesAdded and InterfacesRemoved of {path}: added {added}, removed {removed}')
    t.check(prefix + 'subvolume/om_2d3' in added, f'InterfacesAdded of a snapshot: {added}')
    t.check(prefix + 'subvolume/om_2dkept' in added, f'InterfacesAdded of the snapshot a task kept: {added}')
    t.check(any(p.startswith(prefix + 'job/') for p in added & removed), f'the signals of a job: {added}, {removed}')
    t.check_equal(known, managed_objects(bus), 'the objects known from the signals')
    d.cowbox(bus, 'rm', 'om-3')
    d.cowbox(bus, 'rm', 'om-kept')


def check_job_text_not_utf8(bus, store):
    """A job's error and result may quote paths whose bytes are not UTF-8:
    the job still ends with JobRemoved (a receive refused for such a path
    is reported, not waited for forever), and scrub lists a damaged file
    of such a name."""
    stream = os.path.join(store.tmp, 'odd-path.stream')
    with open(stream, 'wb') as f:
        f.write(st.simple_stream(name='odd-path', body=[st.command('mkfile', ('path', b'/x\xff'))]))
    r = d.run(bus, [d.client_exe(), 'image', 'receive', '-f', stream], expect=1, timeout=60)
    t.check("mkfile '/x\ufffd': absolute paths are refused" in r.err, f'a receive refused for such a path:\n{r.err}')

    d.cowbox(bus, 'snapshot', 'base', 'scrubbed')
    data = os.urandom(256 * 1024)
    with store.mount('scrubbed') as m:
        with open(os.path.join(os.fsencode(m.path), b'odd-\xff'), 'wb') as f:
            f.write(data)
    needle = data[65536 + 4096:65536 + 4160]
    for pack in glob.glob(os.path.join(store.path, 'packs', '*.pack')):
        with open(pack, 'r+b') as f:
            at = f.read().find(needle)
            if at >= 0:
                f.seek(at + 10)
                byte = f.read(1)[0]
                f.seek(at + 10)
                f.write(bytes([byte ^ 0x40]))
                break
    else:
        t.fail('the block to damage is in no pack file')
    report = json.loads(d.cowbox(bus, '--json', 'scrub', expect=1).out)
    t.check(report['files_damaged'] == 1 and [x['path'] for x in report['damage']] == ['/odd-\ufffd'],
            f'the scrub of a damaged file whose name is not UTF-8: {report}')
    d.cowbox(bus, 'rm', 'scrubbed')


def process_state(pid):
    with open(f'/proc/{pid}/stat') as f:
        return f.read().rsplit(')', 1)[1].split()[0]


def check_kill_after_end(bus, daemon):
    """A kill (a cancel) that reaches the daemon after the run's worker
    ended is too late: the run is reported as it ended, not as killed.
    The daemon is stopped while the worker ends, and the kill is queued
    for it meanwhile."""
    env = dict(os.environ, **bus.env)
    d.cowbox(bus, 'sandbox', 'create', 'late', '--image', 'base', '--workdir', WORKDIR, '--', '/bin/sleep', '2')
    pid = daemon.proc.pid
    before = children(pid)
    d.cowbox(bus, 'sandbox', 'start', 'late')
    workers = children(pid) - before
    t.check(len(workers) == 1, f'the worker of the run: {workers}')
    worker = workers.pop()
    os.kill(pid, signal.SIGSTOP)
    try:
        d.wait_for('the worker to end', lambda: process_state(worker) == 'Z')
        caller = subprocess.Popen([d.client_exe(), 'sandbox', 'kill', 'late'], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        time.sleep(1)
    finally:
        os.kill(pid, signal.SIGCONT)
    _, err = caller.communicate(timeout=60)
    t.check(caller.returncode == 1 and 'not running' in err, f'a kill after the run ended:\n{err}')
    doc = json.loads(d.cowbox(bus, '--json', 'sandbox', 'wait', 'late').out)
    t.check(doc['state'] == 'exited' and doc['result']['exit_status'] == 0 and not doc['result']['cancelled'],
            f'a run that ended before the kill reached the daemon: {doc}')
    d.cowbox(bus, 'sandbox', 'rm', 'late')


def check_sandbox_run_killed_with_daemon(bus, daemon):
    """A sandbox whose run died with cowboxd says so after the restart: it
    does not show the exit of the run before it as this one's."""
    d.cowbox(bus, 'sandbox', 'create', 'crashed', '--image', 'base', '--workdir', WORKDIR, '--', '/bin/sh', '-c',
             f'if [ -e {WORKDIR}/ran ]; then sleep 60; fi; touch {WORKDIR}/ran')
    d.cowbox(bus, 'sandbox', 'start', 'crashed')
    d.cowbox(bus, 'sandbox', 'wait', 'crashed')
    d.cowbox(bus, 'sandbox', 'start', 'crashed')
    time.sleep(1)
    daemon.kill(signal.SIGKILL)
    daemon.start()
    doc = json.loads(d.cowbox(bus, '--json', 'sandbox', 'wait', 'crashed').out)
    t.check(doc['state'] == 'failed' and 'exit_status' not in doc['result'] and 'cowboxd' in doc['result']['error'],
            f'a sandbox whose run died with the daemon: {doc}')
    r = d.cowbox(bus, 'sandbox', 'wait', 'crashed', expect=1)
    t.check('failed' in r.err, f'cowbox sandbox wait of a run that died with the daemon:\n{r.describe()}')
    r = d.cowbox(bus, 'sandbox', 'show', 'crashed')
    t.check('Exit:' not in r.out and 'Error:' in r.out, f'cowbox sandbox show of it:\n{r.out}')
    d.cowbox(bus, 'sandbox', 'rm', 'crashed')


def check_damaged_subvolume_record(bus, store):
    """A subvolume whose record in the catalog is damaged (a value changed,
    its check left as it was, as a flipped bit would) does not hide the
    others: ListSubvolumes lists them as they are and it marked damaged,
    GetStatus counts it, GetSubvolume of it fails with StoreFailed, `cowbox
    list` names it, and DeleteSubvolume of it mends the store; or, when
    its name is no longer a valid one, `cowbox-store subvolume delete --id`,
    which `cowbox list` names without printing the name."""
    d.gdbus_call(bus, 'Snapshot', 'base', 'flipped', '{}')
    catalog = t.open_catalog(store.path)
    try:
        (flipped_id, check) = catalog.execute("SELECT id, row_check FROM subvolumes WHERE name = 'flipped' "
                                              "AND deleted = 0").fetchone()
        catalog.execute("UPDATE subvolumes SET readonly = 1 - readonly WHERE name = 'flipped' AND deleted = 0")
        catalog.execute("UPDATE subvolumes SET row_check = ? WHERE name = 'flipped' AND deleted = 0", (check,))
        catalog.commit()
    finally:
        catalog.close()

    listed = {s['name']: s for s in d.gdbus_json(bus, 'ListSubvolumes')}
    t.check('flipped' in listed and listed['flipped']['damaged'] is True,
            f'the damaged subvolume in ListSubvolumes: {listed.get("flipped")}')
    t.check(listed['base']['damaged'] is False and listed['base']['inodes'] > 0,
            f'an undamaged subvolume beside it: {listed["base"]}')
    t.check_equal(d.gdbus_json(bus, 'GetStatus')['usage']['damaged_subvolumes'], 1, 'damaged subvolumes in GetStatus')
    r = d.gdbus_call(bus, 'GetSubvolume', 'flipped', expect='fail')
    t.check_equal(d.error_name(r), 'org.cowbox1.Error.StoreFailed', f'GetSubvolume of a damaged record: {r.err}')
    t.check_equal(listed['flipped']['id'], flipped_id, 'the ID of the damaged subvolume in ListSubvolumes')
    r = d.cowbox(bus, 'list')
    t.check(re.search(r"^flipped +- +damaged record: 'cowbox rm flipped'", r.out, re.M) and
            re.search(r'^base ', r.out, re.M), f'cowbox list with a damaged record:\n{r.out}')

    d.gdbus_call(bus, 'DeleteSubvolume', 'flipped')
    listed = d.gdbus_json(bus, 'ListSubvolumes')
    t.check('flipped' not in [s['name'] for s in listed] and not any(s['damaged'] for s in listed),
            f'ListSubvolumes once the damaged subvolume was deleted: {listed}')

    # Its name damaged into one no call accepts, with a control character:
    # not sent to the terminal, and deleted by its ID.
    d.gdbus_call(bus, 'Snapshot', 'base', 'garbled', '{}')
    catalog = t.open_catalog(store.path)
    try:
        (garbled_id, check) = catalog.execute("SELECT id, row_check FROM subvolumes WHERE name = 'garbled' "
                                              "AND deleted = 0").fetchone()
        catalog.execute("UPDATE subvolumes SET name = 'gar\x1b[2Jbled' WHERE id = ?", (garbled_id,))
        catalog.execute("UPDATE subvolumes SET row_check = ? WHERE id = ?", (check, garbled_id))
        catalog.commit()
    finally:
        catalog.close()
    r = d.cowbox(bus, 'list')
    t.check(f"damaged record of ID {garbled_id}: 'cowbox-store subvolume delete --id {garbled_id}'" in r.out
            and '\x1b' not in r.out, f'cowbox list with a damaged record of an invalid name:\n{r.out!r}')
    store.run('subvolume', 'delete', '--id', str(garbled_id))
    listed = d.gdbus_json(bus, 'ListSubvolumes')
    t.check(not any(s['damaged'] for s in listed), f'ListSubvolumes once it was deleted by ID: {listed}')
    t.check_equal(d.gdbus_json(bus, 'GetStatus')['usage']['damaged_subvolumes'], 0,
                  'damaged subvolumes in GetStatus once it was deleted')


def check_output_private(bus, store):
    """A task's output may hold secrets: a user who may not run tasks reads
    a sandbox's result without it (listed, waited for, as a property, from
    the object manager), and receives no JobRemoved signal, which carries a
    task's report; root and the group read it all."""
    user = d.ensure_user('cowbox-test-user')
    d.cowbox(bus, 'sandbox', 'create', 'secretive', '--image', 'base', '--workdir', WORKDIR, '--',
             '/bin/sh', '-c', 'echo TOKEN-$((40 + 2))')
    d.cowbox(bus, 'sandbox', 'start', 'secretive')
    doc = json.loads(d.cowbox(bus, '--json', 'sandbox', 'wait', 'secretive').out)
    t.check_equal(doc['result']['stdout'], 'TOKEN-42\n', 'the output root reads')
    properties = 'org.freedesktop.DBus.Properties'
    reads = (('ListSandboxes', ('ListSandboxes',), {}),
             ('WaitSandbox', ('WaitSandbox', 'secretive'), {}),
             ('the Json property', ('Get', 'org.cowbox1.Sandbox', 'Json'),
              {'path': '/org/cowbox1/sandbox/secretive', 'interface': properties}),
             ('GetManagedObjects', ('GetManagedObjects',), {'interface': 'org.freedesktop.DBus.ObjectManager'}))
    for what, args, where in reads:
        r = d.gdbus_call(bus, *args, user=user, **where)
        t.check('secretive' in r.out and 'exit_status' in r.out and 'TOKEN-42' not in r.out,
                f'{what} as a user who may not run tasks: {r.out[:2000]}')
        r = d.gdbus_call(bus, *args, **where)
        t.check('TOKEN-42' in r.out, f'{what} as root: {r.out[:2000]}')
    state = store.path + '-sandboxes/.sandboxes.json'
    t.check_equal(os.stat(state).st_mode & 0o077, 0, 'the mode of the sandboxes\' list, which holds their output')
    d.cowbox(bus, 'sandbox', 'rm', 'secretive')

    monitors = []
    for who in (user, None):
        argv = ['gdbus', 'monitor', '--system', '--dest', 'org.cowbox1']
        if who:
            argv = ['setpriv', f'--reuid={who[0]}', f'--regid={who[1]}', '--clear-groups'] + argv
        log = open(os.path.join(store.new_dir(f'monitor-{len(monitors)}'), 'log'), 'w+')
        monitors.append((subprocess.Popen(argv, env=dict(os.environ, **bus.env), stdout=log,
                                          stderr=subprocess.STDOUT), log))
    try:
        time.sleep(1)
        run_json(bus, '/bin/sh', '-c', 'echo TOKEN-$((40 + 3))')
        time.sleep(1)
    finally:
        for p, _ in monitors:
            p.terminate()
            p.wait()
    (_, user_log), (_, root_log) = monitors
    seen = [open(log.name).read() for log in (user_log, root_log)]
    t.check('TOKEN-43' in seen[1], f'the report in JobRemoved, as root sees it: {seen[1][-2000:]}')
    t.check('JobRemoved' not in seen[0] and 'TOKEN-43' not in seen[0],
            f'the signals a user who may not run tasks receives: {seen[0][-2000:]}')


def check_client_subvolume_commands(bus, store):
    """cowbox creates, renames, limits and freezes a subvolume, as the API
    does, and refuses a size, a flag or a name it cannot take."""
    r = d.cowbox(bus, 'create', 'made')
    t.check_equal(r.out, 'Subvolume created.\n', 'cowbox create says what it did')
    t.check_equal(store.show('made')['readonly'], False, 'a subvolume cowbox created')
    d.cowbox(bus, 'set-quota', 'made', '5M')
    t.check_equal(store.show('made')['quota_bytes'], 5 * MiB, 'the quota cowbox set')
    d.cowbox(bus, 'set-quota', 'made', 'none')
    t.check_equal(store.show('made')['quota_bytes'], 0, 'the quota cowbox lifted')
    r = d.cowbox(bus, 'set-quota', 'made', 'lots', expect=2)
    t.check("'lots' is not a size" in r.err, f'cowbox set-quota of no size: {r.err}')
    r = d.cowbox(bus, 'set-readonly', 'made', 'true')
    t.check_equal((r.out, store.show('made')['readonly']), ('Subvolume is read-only.\n', True),
                  'cowbox set-readonly true')
    r = d.cowbox(bus, 'set-readonly', 'made', 'perhaps', expect=2)
    t.check('neither true nor false' in r.err, f'cowbox set-readonly perhaps: {r.err}')
    d.cowbox(bus, 'rename', 'made', 'renamed')
    t.check('renamed' in store.names() and 'made' not in store.names(), f'after cowbox rename: {store.names()}')
    r = d.cowbox(bus, 'rename', 'renamed', 'base', expect=1)
    t.check("'base' is taken" in r.err, f'cowbox rename onto a taken name: {r.err}')
    d.cowbox(bus, 'set-readonly', 'renamed', 'false')
    t.check_equal(store.show('renamed')['readonly'], False, 'cowbox set-readonly false')
    d.cowbox(bus, 'rm', 'renamed')


def run():
    d.require_dbus()
    t.require_fuse()
    with t.Store('api-edges') as store:
        with d.bus_and_daemon(store) as (bus, daemon):
            make_image(bus)
            d.cowbox(bus, 'sandbox', 'create', 'kept', '--image', 'base', '--', '/bin/true')
            d.cowbox(bus, 'workspace', 'create', 'ws', '--image', 'base')
        check_damaged_state(store)
        with d.bus_and_daemon(store) as (bus, daemon):
            t.check_equal([b['name'] for b in json.loads(d.cowbox(bus, '--json', 'sandbox', 'list').out)], ['kept'],
                          'the sandboxes of a repaired list')
            t.check_equal([w['name'] for w in json.loads(d.cowbox(bus, '--json', 'workspace', 'list').out)], ['ws'],
                          'the workspaces of a repaired list')
            # A workspace's limit is set as a workspace's, not as a quota.
            r = d.gdbus_call(bus, 'SetQuota', 'workspace-ws', '1000000', expect='fail')
            t.check_equal(d.error_name(r), 'org.cowbox1.Error.Busy', f'SetQuota of a workspace: {r.err}')
            t.check('SetWorkspaceLimit' in r.err, f'the error of SetQuota of a workspace says what to call: {r.err}')
            t.check_equal(store.show('workspace-ws')['quota_bytes'], 0, 'the quota of a workspace after SetQuota')
            d.cowbox(bus, 'sandbox', 'rm', 'kept')
            d.cowbox(bus, 'workspace', 'rm', 'ws')
            check_nul_output(bus)
            check_output_characters(bus)
            check_task_options(bus)
            check_disk_limit(bus, store)
            check_waiters_of_one_caller(bus)
            check_waiters_of_unprivileged(bus)
            check_workspace_beside_task(bus)
            check_signals(bus)
            check_caller_gone_at_once(bus, daemon, store)
            check_name_not_utf8(bus, store)
            check_object_manager_signals(bus, store)
            check_job_text_not_utf8(bus, store)
            check_kill_after_end(bus, daemon)
            check_sandbox_run_killed_with_daemon(bus, daemon)
            check_wait_unstarted(bus)
            check_client_usage(bus, daemon)
            check_damaged_subvolume_record(bus, store)
            check_client_subvolume_commands(bus, store)
            check_output_private(bus, store)


if __name__ == '__main__':
    t.main(run)
