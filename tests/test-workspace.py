#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Developer workspaces through cowboxd, used by a real unprivileged user:
git init, commit and fsck inside one, a checkpoint, damage, a restore that
brings the committed state back; the limit (EDQUOT with the synced data
intact, the warning signal, a raised limit); another user kept out; and
the workspace mounted again with its data after a restart of the daemon
and after its mount went away (as after a reboot)."""

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
import daemon_test as d  # noqa: E402

# The system's Python: one of the caller's own (a virtual environment in
# root's home) may be closed to the test's user.
USER_PYTHON = '/usr/bin/python3' if os.access('/usr/bin/python3', os.X_OK) else 'python3'

FILL = '''
import errno, os, sys
path, count = sys.argv[1], int(sys.argv[2])
for i in range(count):
    data = os.urandom(128 << 10)    # each file its own: the store keeps a block once
    try:
        fd = os.open(os.path.join(path, f'fill{i}'), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        print(f'stopped {i} {errno.errorcode[e.errno]}')
        sys.exit(0)
print(f'wrote {count}')
'''

# One file written in 1 MiB pieces, no fsync: an editor or a compiler.
BUFFERED = '''
import errno, os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
written, result = 0, 'no error'
try:
    for i in range(int(sys.argv[2])):
        written += os.write(fd, bytes([i % 251]) * (1 << 20))
except OSError as e:
    result = 'write ' + errno.errorcode[e.errno]
try:
    os.close(fd)
except OSError as e:
    result += ' close ' + errno.errorcode[e.errno]
print(result, written)
'''

# Past the 25 s that D-Bus clients wait by default for a reply.
CLIENT_PATIENCE_SEC = 27


def as_user(bus, user, *argv, expect=0):
    return d.run(bus, list(argv), expect=expect, user=user)


def git(bus, user, path, *args, expect=0):
    return as_user(bus, user, 'git', '-C', path, '-c', 'user.name=Dev', '-c', 'user.email=dev@example.com',
                   '-c', 'init.defaultBranch=main', *args, expect=expect)


def make_image(store):
    store.create('src')
    with store.mount('src') as m:
        os.makedirs(m.p('lib'))
        t.write_file(m.p('README'), b'the project\n')
        t.write_file(m.p('lib', 'code.c'), b'int main(void) { return 0; }\n')
    store.snapshot('src', 'src-main', readonly=True)
    store.run('subvolume', 'delete', 'src')


def check_disk_full():
    """A workspace on a full disk: ENOSPC to the writer, its earlier data
    intact, shown in workspace show and signalled."""
    t.require_program('mkfs.ext4')
    with t.Store('workspace-disk', init=False) as store:
        image = os.path.join(store.tmp, 'disk.img')
        fs = store.new_dir('fs')
        with open(image, 'wb') as f:
            f.truncate(96 * t.MiB)
        subprocess.run(['mkfs.ext4', '-q', '-F', image], check=True, capture_output=True)
        if subprocess.run(['mount', '-o', 'loop', image, fs], capture_output=True).returncode != 0:
            print('disk full: cannot mount ext4 on a loop file here; skipped', flush=True)
            return
        store.path = os.path.join(fs, 'store')
        store.run('init')
        make_image(store)
        dev = d.ensure_user('cowbox-test-dev')
        with d.bus_and_daemon(store) as (bus, daemon):
            log = os.path.join(store.tmp, 'signals')
            monitor = subprocess.Popen(['dbus-monitor', '--system', "type='signal',sender='org.cowbox1'"],
                                       env=dict(os.environ, **bus.env), stdout=open(log, 'w'),
                                       stderr=subprocess.DEVNULL)
            try:
                time.sleep(0.5)
                r = d.cowbox(bus, '--json', 'workspace', 'create', 'dev', '--image', 'src-main',
                             '--owner', 'cowbox-test-dev')
                path = __import__('json').loads(r.out)['path']
                r = as_user(bus, dev, USER_PYTHON, '-c', FILL, path, '2000')
                t.check('ENOSPC' in r.out, f'filling the disk under a workspace: {r.out}')
                t.check_equal(t.read_file(os.path.join(path, 'README')), b'the project\n', 'a file at ENOSPC')
                d.wait_for('the disk-full signal', lambda: 'WorkspaceDiskFull' in open(log).read())
                shown = __import__('json').loads(d.cowbox(bus, '--json', 'workspace', 'show', 'dev').out)
                t.check(shown['disk_full'], f'workspace show says the disk is full: {shown}')
                # Another program takes what was left: the daemon still
                # removes the workspace, and its reaper frees the space.
                filler = t.fill_file_system(fs)
                try:
                    d.cowbox(bus, 'workspace', 'rm', 'dev')
                    d.wait_for('the space of the removed workspace', lambda: t.free_bytes(fs) > 32 * t.MiB)
                finally:
                    os.unlink(filler)
            finally:
                monitor.terminate()
                monitor.wait()


def check_workspace_text(bus, dev, path):
    """What the client prints for people of a workspace near its limit:
    its fields, and its row in the list."""
    shown = d.cowbox(bus, 'workspace', 'show', 'dev', user=dev).out
    for pattern in (r'^Name: +dev$', r'^State: +mounted, (full|near its limit)$', rf'^Path: +{re.escape(path)}$',
                    rf'^Owner: +cowbox-test-dev \({dev[0]}\)$', r'^Image: +src-main$', r'^Limit: +8\.0 MiB$'):
        t.check(re.search(pattern, shown, re.M), f'{pattern} in cowbox workspace show:\n{shown}')
    lines = d.cowbox(bus, 'workspace', 'list').out.splitlines()
    t.check_equal(lines[0].split(), ['NAME', 'STATE', 'OWNER', 'LOGICAL', 'LIMIT', 'PATH'], 'workspace list header')
    rows = [line.split() for line in lines[1:]]
    t.check([r[:3] + r[-3:] for r in rows] == [['dev', 'mounted', 'cowbox-test-dev', '8.0', 'MiB', path]],
            f'the rows of cowbox workspace list: {rows}')


def workspace_names(bus):
    return sorted(w['name'] for w in d.gdbus_json(bus, 'ListWorkspaces'))


def check_misuse(dev, other):
    """Calls that must not break a workspace, on a bus that lets everyone
    call everything, so that cowboxd's own checks are what is tested: mount
    points that are not safe; a workspace whose name is another's plus
    '.restoring' left alone by the other's restore; a killed server
    replaced; a workspace's subvolume not renamed or deleted behind its
    back; a checkpoint sent only to its owner; an image's quota not
    inherited; a limit near 2^64 that does not overflow."""
    with t.Store('workspace-misuse') as store:
        make_image(store)
        with d.bus_and_daemon(store, policy='open') as (bus, daemon):
            def create(name, *opts, expect=0):
                return d.cowbox(bus, '--json', 'workspace', 'create', name, '--image', 'src-main',
                                '--owner', 'cowbox-test-dev', *opts, expect=expect)

            path = json.loads(create('dev').out)['path']
            twin_path = json.loads(create('dev.restoring').out)['path']
            as_user(bus, dev, 'sh', '-c', f'echo mine > {twin_path}/twin && echo dev > {path}/dev')

            # Mount points that would hide the store, a workspace or files.
            scratch = store.new_dir('scratch')
            full = store.new_dir('full')
            t.write_file(os.path.join(full, 'file'), b'x')
            os.symlink(store.new_dir('target'), os.path.join(scratch, 'link'))
            # A name given in UTF-8 that resolves to one that is not.
            latin1 = os.fsencode(scratch) + b'/caf\xe9'
            os.mkdir(latin1)
            os.symlink(b'caf\xe9', os.path.join(scratch, 'cafe'))
            for bad, why in ((store.path, 'outside the store'), (os.path.join(store.path, 'x'), 'outside the store'),
                             (os.path.dirname(store.path), 'outside the store'),
                             (path, 'outside every other workspace'), (path + '/sub', 'outside every other workspace'),
                             (os.path.dirname(path), 'outside the store'),
                             # Another workspace's default place, or the daemon's files.
                             (os.path.join(os.path.dirname(path), 'wb'), "as the workspace's own"),
                             (os.path.join(os.path.dirname(path), '.workspaces.json.tmp'), "as the workspace's own"),
                             (scratch + '/inner/..', "'..'"), (scratch + '//x', "'//'"), (scratch + '/x/', "'/'"),
                             ('/nonexistent-dir/sub', 'a directory that exists'),
                             (full, 'not an empty directory'), (scratch + '/link', 'not an empty directory'),
                             (scratch + '/cafe/ws', 'UTF-8'),
                             ('relative', 'absolute')):
                r = d.gdbus_call(bus, 'CreateWorkspace', 'bad', json.dumps({'image': 'src-main', 'path': bad}),
                                 expect='fail')
                t.check(d.error_name(r) == 'org.cowbox1.Error.InvalidJSON' and why in r.err,
                        f'a workspace at {bad}: expected InvalidJSON saying "{why}":\n{r.err}')
            t.check_equal(workspace_names(bus), ['dev', 'dev.restoring'], 'workspaces after the refused paths')
            t.check_equal(os.listdir(full), ['file'], 'a directory refused as a mount point')
            t.check_equal(os.listdir(latin1), [], 'a directory whose name is not UTF-8, after the refusal')
            t.check('workspace-bad' not in store.names(), 'a subvolume of a workspace that was refused')
            create('custom', '--path', scratch + '/custom')
            t.check(os.path.ismount(scratch + '/custom'), 'a workspace at a path of its own')
            d.cowbox(bus, 'workspace', 'rm', 'custom')
            # One workspace may not take another's default place; its own it may.
            r = create('wa', '--path', os.path.join(os.path.dirname(path), 'wb'), expect=1)
            t.check("as the workspace's own" in r.err, f'a workspace at the default place of another:\n{r.err}')
            wb = json.loads(create('wb').out)['path']
            t.check(os.path.ismount(wb), 'a workspace at its default place, given to none other')
            own = json.loads(create('own', '--path', os.path.join(os.path.dirname(path), 'own')).out)['path']
            t.check(os.path.ismount(own), 'a workspace given its own default place as its path')
            for name in ('wb', 'own'):
                d.cowbox(bus, 'workspace', 'rm', name)

            # A restore of dev leaves dev.restoring alone.
            d.cowbox(bus, 'workspace', 'checkpoint', 'dev', 'good')
            as_user(bus, dev, 'sh', '-c', f'echo changed > {path}/dev')
            d.cowbox(bus, 'workspace', 'restore', 'dev', 'good')
            t.check_equal(t.read_file(os.path.join(path, 'dev')), b'dev\n', 'dev after its restore')
            t.check_equal(t.read_file(os.path.join(twin_path, 'twin')), b'mine\n', 'dev.restoring after dev\'s restore')

            # Its server killed, a workspace is served again and says so.
            as_user(bus, dev, 'sync', os.path.join(twin_path, 'twin'))     # kill -9 keeps what was synced
            server = store.show('workspace-dev.restoring')['mounted_by']
            os.kill(server, signal.SIGKILL)
            d.wait_for('the killed server to be replaced',
                       lambda: store.show('workspace-dev.restoring')['mounted_by'] not in (0, server) and
                       os.path.exists(os.path.join(twin_path, 'twin')))
            t.check_equal(d.gdbus_json(bus, 'GetWorkspace', 'dev.restoring')['state'], 'mounted',
                          'the state of a workspace served again')
            t.check_equal(t.read_file(os.path.join(twin_path, 'twin')), b'mine\n', 'a file after its server died')

            # Its subvolume mounted elsewhere: RemoveWorkspace answers
            # Busy at once, and the workspace is served again after.
            daemon.stop()
            subprocess.run(['umount', path], check=True)
            d.wait_for('the server to let go', lambda: store.show('workspace-dev')['mounted_by'] == 0)
            with store.mount('workspace-dev'):
                daemon.start()
                started = time.monotonic()
                r = d.cowbox(bus, 'workspace', 'rm', 'dev', expect=1)
                t.check(time.monotonic() - started < 3 and 'in use' in r.err,
                        f'removing a workspace whose subvolume is mounted elsewhere:\n{r.err}')
            d.wait_for('the workspace served again', lambda: os.path.exists(os.path.join(path, 'dev')))

            # The workspace's subvolume is the workspace's.
            for method, args in (('Rename', ['workspace-dev', 'stolen']), ('DeleteSubvolume', ['workspace-dev']),
                                 ('SetReadOnly', ['workspace-dev', 'true'])):
                r = d.gdbus_call(bus, method, *args, expect='fail')
                t.check(d.error_name(r) == 'org.cowbox1.Error.Busy' and 'RemoveWorkspace' in r.err,
                        f'{method}{tuple(args)}: expected Busy naming RemoveWorkspace:\n{r.err}')
            t.check_equal(t.read_file(os.path.join(path, 'dev')), b'dev\n', 'dev after the refused calls')

            # A checkpoint is sent to its owner, root and the group only.
            r = d.cowbox(bus, 'image', 'send', '-f', '/dev/null', 'workspace-dev@good', expect=1, user=other)
            t.check('denied' in r.err.lower() or 'root and members' in r.err,
                    f'another user sending a checkpoint:\n{r.err}')
            sent = os.path.join(scratch, 'sent')
            open(sent, 'w').close()
            os.chmod(sent, 0o666)
            d.cowbox(bus, 'image', 'send', '-f', sent, 'workspace-dev@good', user=dev)
            t.check(os.path.getsize(sent) > 0, 'the owner sends a checkpoint')

            # An image's quota stays the image's.
            store.run('subvolume', 'set-quota', 'src-main', '5')
            free_path = json.loads(create('free').out)['path']
            as_user(bus, dev, 'sh', '-c', f'head -c 1048576 /dev/zero > {free_path}/big')
            t.check_equal(os.path.getsize(os.path.join(free_path, 'big')), 1 << 20,
                          'a write to a workspace of an image with a quota')

            # A limit near 2^64 is far from reached.
            d.gdbus_call(bus, 'SetWorkspaceLimit', 'free', '204963823041217241')
            time.sleep(2.5)     # one round of the daemon's watch
            shown = d.gdbus_json(bus, 'GetWorkspace', 'free')
            t.check(not shown['warning'] and not shown['full'], f'a workspace with a huge limit: {shown}')

            # The list cannot be saved (its temporary file's name taken):
            # a call that answers an error changes nothing.
            blocker = os.path.join(store.path + '-workspaces', '.workspaces.json.tmp')
            os.mkdir(blocker)
            d.gdbus_call(bus, 'SetWorkspaceLimit', 'free', str(32 << 20), expect='fail')
            t.check_equal(d.gdbus_json(bus, 'GetWorkspace', 'free')['limit_bytes'], 204963823041217241,
                          'the limit after a SetWorkspaceLimit that failed')
            t.check_equal(store.show('workspace-free')['quota_bytes'], 204963823041217241,
                          'the quota after a SetWorkspaceLimit that failed')
            os.rmdir(blocker)
            d.gdbus_call(bus, 'SetWorkspaceLimit', 'free', str(32 << 20))
            t.check_equal(store.show('workspace-free')['quota_bytes'], 32 << 20, 'the quota after SetWorkspaceLimit')
            daemon.stop()
            daemon.start()
            t.check_equal(d.gdbus_json(bus, 'GetWorkspace', 'free')['limit_bytes'], 32 << 20,
                          'the limit after a restart')
            # A removal whose save failed leaves the workspace listed, as
            # on disk, and is asked for again.
            os.mkdir(blocker)
            d.gdbus_call(bus, 'RemoveWorkspace', 'free', expect='fail')
            t.check_equal(workspace_names(bus), ['dev', 'dev.restoring', 'free'],
                          'the workspaces after a RemoveWorkspace that failed')
            os.rmdir(blocker)
            for name in ('dev', 'dev.restoring', 'free'):
                d.cowbox(bus, 'workspace', 'rm', name)
            daemon.stop()
            daemon.start()
            t.check_equal(workspace_names(bus), [], 'the workspaces after their removal and a restart')


def check_swapped_mount_point(dev):
    """A workspace's owner controls the directory its mount point lies in,
    and may swap the mount point, or a directory above it, for a symbolic
    link while it is not mounted: across a restart of the daemon and
    during a restore. The daemon then mounts nothing at all, least of all
    over the link's target, says why, and mounts the workspace again once
    its mount point is a plain directory."""
    with t.Store('workspace-swap') as store:
        make_image(store)
        home = store.new_dir('home')
        os.makedirs(os.path.join(home, 'sub', 'src'))
        for p in (home, os.path.join(home, 'sub'), os.path.join(home, 'sub', 'src')):
            os.chown(p, dev[0], dev[1])
        os.chmod(store.tmp, 0o755)
        path = os.path.join(home, 'sub', 'src')
        # What a link would lead to: a directory of root's, with a file.
        victim = store.new_dir('victim')
        os.mkdir(os.path.join(victim, 'src'))
        t.write_file(os.path.join(victim, 'src', 'file'), b'root\'s\n')
        t.write_file(os.path.join(victim, 'file'), b'root\'s\n')

        def unmounted_by_restart(daemon):
            daemon.stop()
            subprocess.run(['umount', path], check=True)
            d.wait_for('the server to let go', lambda: store.show('workspace-swap')['mounted_by'] == 0)

        def check_refused(bus, what, target):
            t.check(not os.path.ismount(target), f'{what}: {target} was mounted over')
            t.check_equal(t.read_file(os.path.join(target, 'file')), b"root's\n", f'{what}: the file under {target}')
            shown = d.gdbus_json(bus, 'GetWorkspace', 'swap')
            t.check(shown['state'] == 'unmounted' and shown['unsafe_mount_point'],
                    f'{what}: GetWorkspace of a workspace with a link for its mount point: {shown}')
            out = d.cowbox(bus, 'workspace', 'show', 'swap', user=dev).out
            t.check('mount point is not a plain directory' in out, f'{what}: cowbox workspace show:\n{out}')

        with d.bus_and_daemon(store) as (bus, daemon):
            d.cowbox(bus, 'workspace', 'create', 'swap', '--image', 'src-main', '--owner', 'cowbox-test-dev',
                     '--path', path)
            d.cowbox(bus, 'workspace', 'checkpoint', 'swap', 'good', user=dev)

            # The mount point itself, swapped across a restart.
            unmounted_by_restart(daemon)
            as_user(bus, dev, 'sh', '-c', f'rmdir {path} && ln -s {victim} {path}')
            daemon.start()
            time.sleep(2.5)     # one round of the daemon's watch too
            check_refused(bus, 'a link for the mount point after a restart', victim)

            # A restore mounts nothing either, and says why.
            r = d.cowbox(bus, 'workspace', 'restore', 'swap', 'good', user=dev, expect=1)
            t.check('symbolic link' in r.err and path in r.err, f'a restore onto a link:\n{r.err}')
            r = d.gdbus_call(bus, 'RestoreWorkspace', 'swap', 'good', expect='fail')
            t.check_equal(d.error_name(r), 'org.cowbox1.Error.UnsafeMountPoint', 'the error of a restore onto a link')
            check_refused(bus, 'a link for the mount point after a restore', victim)

            # A plain directory again: served within seconds.
            as_user(bus, dev, 'sh', '-c', f'rm {path} && mkdir {path}')
            d.wait_for('the workspace mounted again', lambda: os.path.exists(os.path.join(path, 'README')))
            t.check(not d.gdbus_json(bus, 'GetWorkspace', 'swap')['unsafe_mount_point'],
                    'a workspace mounted again still said its mount point was unsafe')

            # A directory above it swapped: the link leads to a directory
            # that holds a 'src' of root's.
            unmounted_by_restart(daemon)
            sub = os.path.join(home, 'sub')
            as_user(bus, dev, 'sh', '-c', f'mv {sub} {home}/old && ln -s {victim} {sub}')
            daemon.start()
            time.sleep(2.5)
            check_refused(bus, 'a link above the mount point after a restart', os.path.join(victim, 'src'))
            as_user(bus, dev, 'sh', '-c', f'rm {sub} && mv {home}/old {sub}')
            d.wait_for('the workspace mounted again', lambda: os.path.exists(os.path.join(path, 'README')))
            d.cowbox(bus, 'workspace', 'rm', 'swap')


def check_relative_store(dev):
    """A daemon started with a relative --store: the store's path is made
    absolute, so that its workspaces' mount points are absolute, found
    in the kernel's mount table, and removed."""
    with t.Store('workspace-relative') as store:
        make_image(store)
        absolute = store.path
        bus = d.Bus(store)
        daemon = d.Daemon(store, bus)
        store.path = os.path.relpath(absolute)
        try:
            daemon.start()
            shown = json.loads(d.cowbox(bus, '--json', 'workspace', 'create', 'rel', '--image', 'src-main',
                                        '--owner', 'cowbox-test-dev').out)
            path = os.path.join(absolute + '-workspaces', 'rel')
            t.check_equal((shown['path'], shown['state']), (path, 'mounted'), 'a workspace of a relative --store')
            t.check(os.path.ismount(path), f'{path} is not mounted')
            d.cowbox(bus, 'workspace', 'checkpoint', 'rel', 'good', user=dev)
            d.cowbox(bus, 'workspace', 'restore', 'rel', 'good', user=dev)
            d.cowbox(bus, 'workspace', 'rm', 'rel')
            t.check(not os.path.ismount(path), f'{path} is still mounted after rm')
        finally:
            daemon.stop()
            bus.stop()
            store.path = absolute


def check_linked_default_path(dev):
    """A workspace whose default mount point an older daemon saved through
    a symbolic link to the store's directory (it kept --store as given):
    the next daemon names it without the link and mounts it, where a link
    on a path of the owner's choosing is refused."""
    with t.Store('workspace-linked') as store:
        make_image(store)
        link = os.path.join(store.tmp, 'link')
        os.symlink(store.tmp, link)
        with d.bus_and_daemon(store) as (bus, daemon):
            d.cowbox(bus, 'workspace', 'create', 'linked', '--image', 'src-main', '--owner', 'cowbox-test-dev')
            daemon.stop()
            state = os.path.join(store.path + '-workspaces', '.workspaces.json')
            doc = json.load(open(state))
            real = doc['workspaces'][0]['path']
            doc['workspaces'][0]['path'] = os.path.join(link, os.path.relpath(real, store.tmp))
            with open(state, 'w') as f:
                json.dump(doc, f)
            subprocess.run(['umount', '-l', real])
            daemon.start()
            d.wait_for('the workspace to be mounted again',
                       lambda: json.loads(d.cowbox(bus, '--json', 'workspace', 'show', 'linked').out)['state']
                       == 'mounted')
            shown = json.loads(d.cowbox(bus, '--json', 'workspace', 'show', 'linked').out)
            t.check_equal(shown['path'], real, 'the mount point of a workspace saved through a link')
            t.check_equal(json.load(open(state))['workspaces'][0]['path'], real, 'the saved mount point')
            d.cowbox(bus, 'workspace', 'rm', 'linked')


def check_crash_creating(dev):
    """kill -9 of the daemon while CreateWorkspace saves its list: after a
    restart no subvolume is left under a workspace's name that no workspace
    names (no call could delete it, and the workspace could not be made
    again), and the workspace can be made."""
    with t.Store('workspace-crash') as store:
        make_image(store)
        with d.bus_and_daemon(store) as (bus, daemon):
            d.kill_while_saving(bus, daemon, os.path.join(store.path + '-workspaces', '.workspaces.json.tmp'),
                                ['workspace', 'create', 'crashed', '--image', 'src-main', '--owner',
                                 'cowbox-test-dev'])
            if 'crashed' in workspace_names(bus):
                d.cowbox(bus, 'workspace', 'rm', 'crashed')
            t.check_equal([n for n in store.names() if n.startswith('workspace-')], [],
                          'subvolumes of workspaces after kill -9 during CreateWorkspace and a workspace rm')
            d.cowbox(bus, 'workspace', 'create', 'crashed', '--image', 'src-main', '--owner', 'cowbox-test-dev')

            # Killed once the list was saved, before the subvolume was
            # made: the workspace is listed and can be removed.
            daemon.stop()
            state = os.path.join(store.path + '-workspaces', '.workspaces.json')
            doc = json.loads(t.read_file(state))
            ghost = dict(doc['workspaces'][0], name='ghost', path=os.path.join(store.tmp, 'ghost'))
            doc['workspaces'].append(ghost)
            t.write_file(state, json.dumps(doc).encode())
            daemon.start()
            t.check('ghost' in workspace_names(bus), 'a listed workspace whose subvolume was never made')
            # No signal announced its subvolume: none says it went.
            signals = d.signals_of(bus, lambda: d.cowbox(bus, 'workspace', 'rm', 'ghost'))
            t.check('SubvolumeRemoved' not in signals and 'workspace_2dghost' not in signals,
                    f'signals of the removal of a workspace whose subvolume was never made:\n{signals}')
            d.cowbox(bus, 'workspace', 'create', 'ghost', '--image', 'src-main', '--owner', 'cowbox-test-dev')
            for name in ('crashed', 'ghost'):
                d.cowbox(bus, 'workspace', 'rm', name)
        store.fsck()


def check_restore_cut_short(dev):
    """A restore deletes the workspace's state, then renames the restored
    one to it: after a crash in between (kill -9, a power loss), the
    restarted daemon finishes the switch and serves the restored state."""
    with t.Store('workspace-restore-crash') as store:
        make_image(store)
        with d.bus_and_daemon(store) as (bus, daemon):
            path = json.loads(d.cowbox(bus, '--json', 'workspace', 'create', 'cut', '--image', 'src-main',
                                       '--owner', 'cowbox-test-dev').out)['path']
            as_user(bus, dev, 'sh', '-c', f'echo before > {path}/state')
            d.cowbox(bus, 'workspace', 'checkpoint', 'cut', 'good', user=dev)
            as_user(bus, dev, 'sh', '-c', f'echo after > {path}/state')

            # What a daemon that died between the two leaves.
            daemon.stop()
            subprocess.run(['umount', path], check=True)
            d.wait_for('the server to let go', lambda: store.show('workspace-cut')['mounted_by'] == 0)
            store.snapshot('workspace-cut@good', 'workspace-cut+restoring')
            store.delete('workspace-cut', reap=False)

            daemon.start()
            shown = d.gdbus_json(bus, 'GetWorkspace', 'cut')
            t.check_equal(shown['state'], 'mounted', 'a workspace whose restore a crash cut short, after a restart')
            t.check_equal(t.read_file(os.path.join(path, 'state')), b'before\n',
                          'the workspace whose restore a crash cut short')
            t.check_equal([n for n in store.names() if n.endswith('+restoring')], [],
                          'restored states left under their temporary name')
            d.cowbox(bus, 'workspace', 'restore', 'cut', 'good', user=dev)
            d.cowbox(bus, 'workspace', 'rm', 'cut')
        store.fsck()


def check_restore_left_behind(dev):
    """A daemon killed in a restore after it made the restored state, before
    it deleted the old one, leaves workspace-NAME+restoring beside the
    workspace. That restore never happened: the next daemon drops the
    restored state when it serves the workspace (nobody else may delete
    it, the workspace's, and it would keep the checkpoint's space), and
    the workspace keeps its files. Its removal removes that too, and a
    later workspace of the same name never gets the removed one's
    files."""
    with t.Store('workspace-restore-left') as store:
        make_image(store)
        with d.bus_and_daemon(store) as (bus, daemon):
            path = json.loads(d.cowbox(bus, '--json', 'workspace', 'create', 'old', '--image', 'src-main',
                                       '--owner', 'cowbox-test-dev').out)['path']
            as_user(bus, dev, 'sh', '-c', f'echo secret > {path}/state')
            d.cowbox(bus, 'workspace', 'checkpoint', 'old', 'good', user=dev)
            daemon.stop()
            store.snapshot('workspace-old@good', 'workspace-old+restoring')
            state = os.path.join(store.path + '-workspaces', '.workspaces.json')
            listed = json.loads(t.read_file(state))['workspaces'][0]
            daemon.start()
            t.check_equal([n for n in store.names() if n.startswith('workspace-old')],
                          ['workspace-old', 'workspace-old@good'], 'subvolumes of a workspace whose restore a '
                          'crash cut short before it deleted the old state, after a restart')
            t.check_equal(t.read_file(os.path.join(path, 'state')), b'secret\n',
                          'the workspace whose restore a crash cut short before it deleted the old state')

            # One made while the daemon runs goes with the workspace.
            store.snapshot('workspace-old@good', 'workspace-old+restoring')
            d.cowbox(bus, 'workspace', 'rm', 'old')
            t.check_equal([n for n in store.names() if n.startswith('workspace-')], [],
                          'subvolumes of a removed workspace whose restore a crash cut short')

            # A new workspace of that name, its daemon killed once it was
            # listed, before its subvolume was made.
            daemon.stop()
            doc = json.loads(t.read_file(state))
            doc['workspaces'].append(listed)
            t.write_file(state, json.dumps(doc).encode())
            daemon.start()
            t.check(not os.path.exists(os.path.join(path, 'state')),
                    'a new workspace serves the files of a removed one')
            # With nothing to serve, it is never busy being mounted: before,
            # the watch started a server for it every two seconds, which
            # failed, and calls that met one were refused.
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                r = d.gdbus_call(bus, 'SetWorkspaceLimit', 'old', '0', expect=None)
                t.check(d.error_name(r) != 'org.cowbox1.Error.Busy',
                        f'a workspace without its subvolume, busy:\n{r.describe()}')

            # A checkpoint that cannot be deleted (mounted elsewhere) keeps
            # the workspace listed, so that its removal can be asked again:
            # left behind, a later workspace of the name would take it over.
            d.cowbox(bus, 'workspace', 'rm', 'old')
            d.cowbox(bus, 'workspace', 'create', 'old', '--image', 'src-main', '--owner', 'cowbox-test-dev')
            d.cowbox(bus, 'workspace', 'checkpoint', 'old', 'kept', user=dev)
            with store.mount('workspace-old@kept', readonly=True):
                r = d.cowbox(bus, 'workspace', 'rm', 'old', expect=1)
                t.check('in use' in r.err, f'rm of a workspace whose checkpoint is mounted elsewhere:\n{r.err}')
                t.check_equal(json.loads(d.cowbox(bus, '--json', 'workspace', 'show', 'old').out)['name'], 'old',
                              'the workspace whose removal failed')
            d.cowbox(bus, 'workspace', 'rm', 'old')
            t.check_equal([n for n in store.names() if n.startswith('workspace-')], [],
                          'subvolumes of the workspace removed again')
        store.fsck()


def held_server(store, subvolume, path):
    """Stops the server of subvolume, mounted at path: after an unmount it
    then holds the subvolume as one busy with a long last commit does.
    What was written is committed first: a server stopped inside a commit
    would hold the catalog, and every writer of the store would wait for
    it. Returns a function that lets it go on."""
    server = store.show(subvolume)['mounted_by']
    t.check(server > 0, f'the server of {subvolume}')
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.kill(server, signal.SIGSTOP)
    return lambda: os.kill(server, signal.SIGCONT)


def call_in_background(bus, method, *args):
    return subprocess.Popen(['gdbus', 'call', '--system', '--dest', 'org.cowbox1', '--object-path', '/org/cowbox1',
                             '--method', f'org.cowbox1.Manager.{method}', *args], env=dict(os.environ, **bus.env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def answered_at_once(bus, what):
    """Calls that touch no workspace are answered while an unmount waits."""
    for method in ('GetStatus', 'ListSubvolumes', 'ListWorkspaces'):
        start = time.monotonic()
        d.gdbus_call(bus, method)
        took = time.monotonic() - start
        t.check(took < 5, f'{method} while {what} waits for a server\'s last commit: answered after {took:.1f}s')


def check_unmount_waits_aside(dev):
    """After the unmount of a removal or a restore, the server commits what
    was written and only then lets go of the subvolume: seconds, with much
    written. Meanwhile the daemon answers other calls, refuses other
    changes of that workspace, and answers the removal or the restore
    itself once the server let go; also when it is stopped meanwhile."""
    with t.Store('workspace-unmount') as store:
        make_image(store)
        with d.bus_and_daemon(store) as (bus, daemon):
            path = json.loads(d.cowbox(bus, '--json', 'workspace', 'create', 'slow', '--image', 'src-main',
                                       '--owner', 'cowbox-test-dev').out)['path']
            d.cowbox(bus, 'workspace', 'checkpoint', 'slow', 'good', user=dev)
            # Written without fsync, as an editor or a compiler does.
            as_user(bus, dev, USER_PYTHON, '-c', BUFFERED, path + '/big.o', '8')

            resume = held_server(store, 'workspace-slow', path)
            call = call_in_background(bus, 'RestoreWorkspace', 'slow', 'good')
            try:
                d.wait_for('the restore to unmount the workspace', lambda: not t.is_mounted(path))
                answered_at_once(bus, 'a restore')
                for args in (('workspace', 'rm', 'slow'), ('workspace', 'checkpoint', 'slow', 'other'),
                             ('workspace', 'set-limit', 'slow', '1G'), ('workspace', 'restore', 'slow', 'good')):
                    r = d.cowbox(bus, *args, expect=1)
                    t.check('is being restored' in r.err, f'{args} while a restore waits:\n{r.err}')
                # The restored state, not yet under the workspace's name, is
                # the workspace's all the same.
                for method, *args in (('DeleteSubvolume',), ('Rename', 'taken'), ('SetReadOnly', 'true'),
                                      ('SetQuota', '1')):
                    r = d.gdbus_call(bus, method, 'workspace-slow+restoring', *args, expect='fail')
                    t.check_equal(d.error_name(r), 'org.cowbox1.Error.Busy',
                                  f'{method} of the state a restore is about to switch to')
                t.check(call.poll() is None, 'the restore answered before the server let go')
            finally:
                resume()
            out, err = call.communicate(timeout=60)
            t.check_equal((call.returncode, err), (0, ''), 'the restore once the server let go')
            t.check_equal(json.loads(d.cowbox(bus, '--json', 'workspace', 'show', 'slow').out)['state'], 'mounted',
                          'the restored workspace')
            t.check(not os.path.exists(path + '/big.o'), 'a file written after the checkpoint, after the restore')

            # A server that does not let go within the limit: the removal
            # answers Busy and says why, and the workspace is served again
            # once the server goes on.
            resume = held_server(store, 'workspace-slow', path)
            call = call_in_background(bus, 'RemoveWorkspace', 'slow')
            try:
                out, err = call.communicate(timeout=60)
            finally:
                resume()
            t.check(call.returncode != 0 and 'Error.Busy' in err and 'had not let go of it after 15 s' in err,
                    f'a removal whose server does not let go: exit {call.returncode}\n{err}')
            d.wait_for('the workspace served again', lambda: json.loads(
                d.cowbox(bus, '--json', 'workspace', 'show', 'slow').out)['state'] == 'mounted')

            as_user(bus, dev, USER_PYTHON, '-c', BUFFERED, path + '/big.o', '8')
            resume = held_server(store, 'workspace-slow', path)
            call = call_in_background(bus, 'RemoveWorkspace', 'slow')
            try:
                d.wait_for('the removal to unmount the workspace', lambda: not t.is_mounted(path))
                answered_at_once(bus, 'a removal')
                r = d.cowbox(bus, 'workspace', 'rm', 'slow', expect=1)
                t.check('is being removed' in r.err, f'a second removal while one waits:\n{r.err}')
                r = d.cowbox(bus, 'workspace', 'create', 'slow', '--image', 'src-main', expect=1)
                t.check('is being removed' in r.err, f'a workspace of its name made while it is removed:\n{r.err}')
                # The watch (every 2 s) must not mount it again meanwhile.
                time.sleep(2.5)
                t.check(not t.is_mounted(path), 'a workspace being removed, mounted again')
                t.check(call.poll() is None, 'the removal answered before the server let go')
            finally:
                resume()
            out, err = call.communicate(timeout=60)
            t.check_equal((call.returncode, err), (0, ''), 'the removal once the server let go')
            t.check_equal(workspace_names(bus), [], 'workspaces after the removal')
            t.check_equal([n for n in store.names() if n.startswith('workspace-')], [],
                          'subvolumes of the removed workspace')

            # Stopped while a removal waits: the daemon waits for the
            # server before it exits, and answers the removal.
            path = json.loads(d.cowbox(bus, '--json', 'workspace', 'create', 'late', '--image', 'src-main',
                                       '--owner', 'cowbox-test-dev').out)['path']
            resume = held_server(store, 'workspace-late', path)
            call = call_in_background(bus, 'RemoveWorkspace', 'late')
            try:
                d.wait_for('the removal to unmount the workspace', lambda: not t.is_mounted(path))
                daemon.proc.terminate()
                time.sleep(1)
            finally:
                resume()
            daemon.proc.wait(30)
            out, err = call.communicate(timeout=60)
            t.check_equal((call.returncode, err), (0, ''), 'a removal answered by a daemon that stops')
            daemon.start()
            t.check_equal(workspace_names(bus), [], 'workspaces after a removal answered at the stop')
            t.check_equal([n for n in store.names() if n.startswith('workspace-')], [],
                          'subvolumes of a workspace removed at the stop')
        store.fsck()


def held_as_if_folded(store, subvolume):
    """Holds the lock of subvolume as a fold or a snapshot does for a
    moment: a server that starts waits for it, up to a minute. Returns the
    lock file's path and a function that lets it go."""
    path = os.path.join(store.path, 'locks', f'subvolume-{store.show(subvolume)["id"]}.lock')
    f = open(path, 'a+')
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    f.truncate()
    f.write(f'{os.getpid()} brief\n')
    f.flush()
    return path, f.close


def wait_for_lock_waiter(path, daemon):
    """Until a process other than this one and the daemon (a server that
    starts) has the lock file open: it waits for the lock."""
    def waiting():
        for pid in os.listdir('/proc'):
            if not pid.isdigit() or int(pid) in (os.getpid(), daemon.proc.pid):
                continue
            with contextlib.suppress(OSError):
                for fd in os.listdir(f'/proc/{pid}/fd'):
                    with contextlib.suppress(OSError):
                        if os.readlink(f'/proc/{pid}/fd/{fd}') == path:
                            return True
        return False
    d.wait_for('a server to wait for the lock', waiting)


def check_mount_waits_aside(dev):
    """A server that starts waits for its subvolume's lock while a fold or
    a snapshot holds it: up to a minute. Meanwhile the daemon answers other
    calls and refuses other changes of that workspace; the call whose mount
    waits (here a restore's) is answered once the server is ready; also
    when the daemon is stopped meanwhile."""
    with t.Store('workspace-mount') as store:
        make_image(store)
        with d.bus_and_daemon(store) as (bus, daemon):
            path = json.loads(d.cowbox(bus, '--json', 'workspace', 'create', 'slow', '--image', 'src-main',
                                       '--owner', 'cowbox-test-dev').out)['path']
            d.cowbox(bus, 'workspace', 'checkpoint', 'slow', 'good', user=dev)
            as_user(bus, dev, 'sh', '-c', f'echo later > {path}/later')

            for stop in (False, True):
                # The restored state's lock is taken while the restore
                # waits for the old server: then its new server waits.
                resume = held_server(store, 'workspace-slow', path)
                if stop:
                    call = call_in_background(bus, 'RestoreWorkspace', 'slow', 'good')
                else:
                    # Through cowbox, which waits longer for it than a
                    # D-Bus client does by default (25 s).
                    call = subprocess.Popen([d.client_exe(), 'workspace', 'restore', 'slow', 'good'],
                                            env=dict(os.environ, **bus.env), stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)
                called = time.monotonic()
                release = None
                try:
                    d.wait_for('the restore to unmount the workspace', lambda: not t.is_mounted(path))
                    lock, release = held_as_if_folded(store, 'workspace-slow+restoring')
                    resume()
                    wait_for_lock_waiter(lock, daemon)
                    if stop:
                        daemon.proc.terminate()
                        time.sleep(1)
                    else:
                        start = time.monotonic()
                        d.gdbus_call(bus, 'GetStatus')
                        took = time.monotonic() - start
                        t.check(took < 1, f'GetStatus while a mount waits for its lock: answered after {took:.1f}s')
                        answered_at_once(bus, 'a mount')
                        for args in (('workspace', 'rm', 'slow'), ('workspace', 'checkpoint', 'slow', 'other'),
                                     ('workspace', 'restore', 'slow', 'good')):
                            r = d.cowbox(bus, *args, expect=1)
                            t.check('is being restored' in r.err, f'{args} while its mount waits:\n{r.err}')
                        time.sleep(max(0.0, CLIENT_PATIENCE_SEC - (time.monotonic() - called)))
                    t.check(call.poll() is None, 'the restore answered before its server was ready')
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        resume()    # gone already, once it let go
                    if release:
                        release()
                if stop:
                    daemon.proc.wait(60)
                out, err = call.communicate(timeout=60)
                t.check_equal((call.returncode, err), (0, ''),
                              'the restore once its server was ready' + (', at the stop' if stop else ''))
                if stop:
                    daemon.start()
                t.check_equal(json.loads(d.cowbox(bus, '--json', 'workspace', 'show', 'slow').out)['state'],
                              'mounted', 'the restored workspace')
                t.check(not os.path.exists(path + '/later'), 'a file written after the checkpoint, after the restore')
                as_user(bus, dev, 'sh', '-c', f'echo later > {path}/later')
        store.fsck()


def held_by_the_dead(store, subvolume):
    """held_as_if_folded(), the lock file naming a process that is gone: no
    mount holds the subvolume then, and the watch serves it."""
    gone = subprocess.Popen(['true'])
    gone.wait()
    lock, release = held_as_if_folded(store, subvolume)
    with open(lock, 'w') as f:
        f.write(f'{gone.pid} brief\n')
    return lock, release


def check_watch_mount_then_change(dev):
    """The watch serves a workspace whose server died. While that server
    waits for its subvolume (a fold holds it), nobody asked for the mount:
    a removal or a restore asked for meanwhile is not refused, but done
    once the mount is, and answered then; also when the daemon is stopped
    meanwhile. Other changes are refused as before, a second removal is
    told that one is under way, and a restore to a checkpoint that is not
    there is told so at once."""
    with t.Store('workspace-watch-mount') as store:
        make_image(store)
        with d.bus_and_daemon(store) as (bus, daemon):
            path = json.loads(d.cowbox(bus, '--json', 'workspace', 'create', 'w', '--image', 'src-main',
                                       '--owner', 'cowbox-test-dev').out)['path']
            d.cowbox(bus, 'workspace', 'checkpoint', 'w', 'good', user=dev)
            for method, args, stop in (('RestoreWorkspace', ('w', 'good'), False),
                                       ('RestoreWorkspace', ('w', 'good'), True),
                                       ('RemoveWorkspace', ('w',), False)):
                as_user(bus, dev, 'sh', '-c', f'echo later > {path}/later')
                server = store.show('workspace-w')['mounted_by']
                # Still while the server dies and its lock is taken: the
                # watch must not serve it before.
                os.kill(daemon.proc.pid, signal.SIGSTOP)
                release = None
                try:
                    os.kill(server, signal.SIGKILL)
                    lock, release = held_by_the_dead(store, 'workspace-w')
                    subprocess.run(['umount', '-l', path], check=True)
                finally:
                    os.kill(daemon.proc.pid, signal.SIGCONT)
                try:
                    wait_for_lock_waiter(lock, daemon)
                    r = d.gdbus_call(bus, 'SetWorkspaceLimit', 'w', '0', expect='fail')
                    t.check('is being mounted' in r.err, f'a change while the watch mounts:\n{r.describe()}')
                    r = d.gdbus_call(bus, 'RestoreWorkspace', 'w', 'nope', expect='fail')
                    t.check_equal(d.error_name(r), 'org.cowbox1.Error.NoSuchCheckpoint',
                                  'a restore to no checkpoint while the watch mounts')
                    call = call_in_background(bus, method, *args)
                    doing = 'restored' if method == 'RestoreWorkspace' else 'removed'
                    # Known to the daemon once other changes are refused
                    # for it.
                    d.wait_for(f'the daemon to take {method}', lambda: f'is being {doing}' in d.gdbus_call(
                        bus, 'SetWorkspaceLimit', 'w', '0', expect='fail').err)
                    t.check(call.poll() is None, f'{method} answered while the watch\'s mount waits')
                    r = d.cowbox(bus, 'workspace', 'rm', 'w', expect=1)
                    t.check(f'is being {doing}' in r.err, f'a removal while {method} waits for the watch:\n{r.err}')
                    if stop:
                        daemon.proc.terminate()
                        time.sleep(1)
                        t.check(call.poll() is None, f'{method} answered by a daemon that stops before the '
                                'watch\'s mount was done')
                finally:
                    release()
                if stop:
                    daemon.proc.wait(60)
                out, err = call.communicate(timeout=90)
                t.check_equal((call.returncode, err), (0, ''), f'{method} once the watch\'s mount was done' +
                              (', at the stop' if stop else ''))
                if stop:
                    daemon.start()
                if method == 'RestoreWorkspace':
                    t.check(not os.path.exists(path + '/later'), 'a file written after the checkpoint, after '
                            'a restore that waited for the watch')
            t.check_equal(workspace_names(bus), [], 'workspaces after the removal')
            t.check_equal([n for n in store.names() if n.startswith('workspace-')], [],
                          'subvolumes of the removed workspace')
        store.fsck()


def run():
    d.require_dbus()
    t.require_fuse()
    t.require_program('git')
    t.require_program('setpriv')
    with t.Store('workspace') as store:
        make_image(store)
        dev = d.ensure_user('cowbox-test-dev')
        other = d.ensure_user('cowbox-test-user')
        with d.bus_and_daemon(store) as (bus, daemon):
            monitor_log = os.path.join(store.tmp, 'signals')
            monitor = subprocess.Popen(['dbus-monitor', '--system', "type='signal',sender='org.cowbox1'"],
                                       env=dict(os.environ, **bus.env), stdout=open(monitor_log, 'w'),
                                       stderr=subprocess.DEVNULL)
            try:
                r = d.cowbox(bus, '--json', 'workspace', 'create', 'dev', '--image', 'src-main',
                             '--owner', 'cowbox-test-dev', '--limit', '8M')
                info = __import__('json').loads(r.out)
                path = info['path']
                t.check_equal((info['state'], info['owner'], info['limit_bytes']), ('mounted', dev[0], 8 << 20),
                              'the new workspace')

                # The developer works in it with ordinary tools.
                as_user(bus, dev, 'sh', '-c', f'echo change >> {path}/README && echo new > {path}/new.c')
                git(bus, dev, path, 'init', '-q')
                git(bus, dev, path, 'add', '-A')
                git(bus, dev, path, 'commit', '-q', '-m', 'first')
                git(bus, dev, path, 'fsck', '--strict')
                d.cowbox(bus, 'workspace', 'checkpoint', 'dev', 'good', user=dev)
                listed = d.cowbox(bus, 'workspace', 'checkpoints', 'dev', user=dev).out.splitlines()
                t.check(listed[0].split() == ['LABEL', 'CREATED', 'EXCLUSIVE'] and
                        [line.split()[0] for line in listed[1:]] == ['good'],
                        f'the checkpoint is listed: {listed}')

                # Damage, then go back.
                as_user(bus, dev, 'sh', '-c', f'rm -rf {path}/.git/objects/* && echo garbage > {path}/README')
                git(bus, dev, path, 'fsck', expect='fail')
                d.cowbox(bus, 'workspace', 'restore', 'dev', 'good', user=dev)
                git(bus, dev, path, 'fsck', '--strict')
                t.check_equal(t.read_file(os.path.join(path, 'README')), b'the project\nchange\n',
                              'README after the restore')
                t.check_equal(git(bus, dev, path, 'log', '--format=%s').out.strip(), 'first', 'the git history')
                # What the restore replaced is given back without a reap asked for.
                d.wait_for('the space of the replaced state', lambda: store.usage()['reclaimable_bytes'] == 0)

                # Another user is kept out, by the file system and by cowboxd.
                r = as_user(bus, other, 'ls', path, expect='fail')
                t.check('denied' in r.err.lower(), f'another user listing the workspace:\n{r.err}')
                as_user(bus, other, 'sh', '-c', f'echo x > {path}/intruder', expect='fail')
                for args in (('workspace', 'rm', 'dev'), ('workspace', 'checkpoint', 'dev', 'mine'),
                             ('workspace', 'restore', 'dev', 'good'), ('workspace', 'set-limit', 'dev', '1G')):
                    r = d.cowbox(bus, *args, expect=1, user=other)
                    t.check('denied' in r.err.lower() or 'root and members' in r.err, f'{args} as another user:\n'
                            f'{r.err}')
                # The developer may not change the limit either.
                d.cowbox(bus, 'workspace', 'set-limit', 'dev', '1G', expect=1, user=dev)

                # The limit: EDQUOT, the synced data intact, the warning.
                r = as_user(bus, dev, USER_PYTHON, '-c', FILL, path, '200')
                t.check('EDQUOT' in r.out, f'filling the workspace to its limit: {r.out}')
                filled = int(r.out.split()[1])
                t.check(filled >= 7 * 8, f'only {filled} files of 128 KiB fitted under an 8 MiB limit')
                t.check_equal(t.read_file(os.path.join(path, 'new.c')), b'new\n', 'an earlier file at the limit')
                # Buffered writes see the limit at write(), not as EIO at
                # close(), and the file holds what write() accepted.
                r = as_user(bus, dev, USER_PYTHON, '-c', BUFFERED, path + '/big.o', '16')
                t.check(r.out.startswith('write EDQUOT ') and 'close' not in r.out,
                        f'a buffered 16 MiB write past the limit: {r.out}')
                t.check_equal(os.stat(path + '/big.o').st_size, int(r.out.split()[-1]),
                              'size of a file written past the limit')
                os.unlink(path + '/big.o')
                d.wait_for('the warning signal', lambda: 'WorkspaceWarning' in open(monitor_log).read())
                shown = __import__('json').loads(d.cowbox(bus, '--json', 'workspace', 'show', 'dev').out)
                t.check(shown['warning'], f'workspace show says it is near its limit: {shown}')
                check_workspace_text(bus, dev, path)
                d.cowbox(bus, 'workspace', 'set-limit', 'dev', '64M')
                deadline = time.monotonic() + 15
                while True:
                    r = as_user(bus, dev, USER_PYTHON, '-c', FILL, path + '/lib', '16')
                    if 'wrote 16' in r.out or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
                t.check('wrote 16' in r.out, f'writing after the limit was raised: {r.out}')
            finally:
                monitor.terminate()
                monitor.wait()

            # A restart of the daemon: the workspace stays mounted.
            daemon.stop()
            daemon.start()
            t.check_equal(t.read_file(os.path.join(path, 'README')), b'the project\nchange\n',
                          'README after a restart of the daemon')
            # Its mount gone, as after a reboot: the daemon mounts it again.
            daemon.stop()
            subprocess.run(['umount', path], check=True)
            d.wait_for('the server to let go', lambda: store.show('workspace-dev')['mounted_by'] == 0)
            daemon.start()
            d.wait_for('the workspace mounted again', lambda: os.path.exists(os.path.join(path, 'README')))
            git(bus, dev, path, 'fsck', '--strict')
            t.check_equal(t.read_file(os.path.join(path, 'new.c')), b'new\n', 'new.c after the remount')

            d.cowbox(bus, 'workspace', 'rm', 'dev')
            t.check(not os.path.exists(path) or not os.listdir(path), 'the mount point after rm')
            left = [n for n in store.names() if n.startswith('workspace-')]
            t.check_equal(left, [], 'subvolumes of the workspace after rm')
    check_misuse(dev, other)
    check_swapped_mount_point(dev)
    check_relative_store(dev)
    check_linked_default_path(dev)
    check_crash_creating(dev)
    check_restore_cut_short(dev)
    check_restore_left_behind(dev)
    check_unmount_waits_aside(dev)
    check_mount_waits_aside(dev)
    check_watch_mount_then_change(dev)
    check_disk_full()


if __name__ == '__main__':
    t.main(run)
