#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Sandboxes on real namespaces and cgroups (cowbox-store run).

An image holds a static probe program and a large incompressible file.
Inside a sandbox the task is PID 1's child, sees no host process, has its
own hostname and writes only into its snapshot (the image and a sibling
are unchanged), which the host's users do not reach. A read limit on the store's disk holds (page cache
dropped), also for a store on btrfs, and without it the read is faster; the same for a write limit
(the store writes its packs with direct I/O from the FUSE server in the
sandbox's cgroup, so even cgroup v1 charges them), and a kept snapshot
holds what its task wrote under that limit without fsync. A memory limit ends a task with OOM in the report, a
fork bomb stops at the process limit, a time limit kills. Escapes fail:
mount, module loading, ptrace, a new user namespace, chroot tricks, and
writing to the host or reading a subvolume mounted there in the workdir
shape. 20 tasks run at once on 20
snapshots, each sees only its own changes, and all space comes back. What
a runner killed with -9 left is removed by the next run."""

import concurrent.futures
import glob
import json
import os
import shutil
import shlex
import signal
import socket
import stat
import struct
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
import stream_test  # noqa: E402
from cowbox_test import MiB  # noqa: E402

BIG = 24 * MiB


def probe_exe():
    return os.path.join(os.environ.get('COWBOX_BUILD_ROOT', 'build'), 'tests', 'sandbox-probe')


def run(store, *args, expect=0, timeout=120):
    """cowbox-store --json run ...: the task's stdout and the report."""
    r = store.run('run', *args, expect=expect, json_output=True, timeout=timeout)
    start = r.err.find('{')
    if start < 0:
        t.fail(f'no report on stderr:\n{r.describe()}')
    return r, json.loads(r.err[start:r.err.rfind('}') + 1])


def drop_caches():
    subprocess.run(['sync'], check=True)
    with open('/proc/sys/vm/drop_caches', 'w') as f:
        f.write('3\n')


def make_image(store):
    store.create('base')
    with store.mount('base') as m:
        shutil.copy(probe_exe(), m.p('probe'))
        os.makedirs(m.p('data'))
        t.write_file(m.p('data', 'big'), t.random_bytes(BIG, 9))
        t.write_file(m.p('data', 'small'), b'from the image\n')
    store.snapshot('base', 'img', readonly=True)


def check_inside(store):
    r, rep = run(store, '--hostname', 'box1', 'img', '--', '/probe', 'info')
    words = r.out.split()
    info = dict(zip(words[::2], words[1::2]))
    t.check_equal((info['pid'], info['ppid'], info['hostname']), ('2', '1', 'box1'),
                  'pid, parent and hostname inside')
    t.check(int(info['procs']) <= 3, f'processes seen inside: {info["procs"]}')
    t.check_equal(rep['exit_status'], 0, 'exit status')

    run(store, '--keep', '--name', 'kept1', 'img', '--', '/probe', 'write', '/data/small', 'changed')
    r, _ = run(store, '--keep', '--name', 'kept2', 'img', '--', '/probe', 'ls', '/data')
    with store.mount('img') as m:
        t.check_equal(t.read_file(m.p('data', 'small')), b'from the image\n', 'the image after a task wrote')
    with store.mount('kept1', readonly=True) as m:
        t.check_equal(t.read_file(m.p('data', 'small')), b'changed', 'the task\'s own snapshot')
    with store.mount('kept2', readonly=True) as m:
        t.check_equal(t.read_file(m.p('data', 'small')), b'from the image\n', 'a sibling sandbox')
    store.delete('kept1')
    store.delete('kept2')


def as_nobody():
    os.setgroups([])
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)


def check_host_users_kept_out(store):
    """The snapshot of a running task is mounted for every user (the
    task's users are not its server's), but the host's users do not reach
    it: the image's files are the store's, which only root reads."""
    base = store.path + '-sandboxes/'
    p = subprocess.Popen([t.tool(), '--store', store.path, 'run', 'img', '--', '/probe', 'trap-term', '60'],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        t.check_equal(p.stdout.readline(), 'trapping\n', 'the task before a host user looks')
        mounts = [m for m in t.mount_table() if m.startswith(base)]
        t.check_equal(len(mounts), 1, f'the mounts of a running task: {mounts}')
        r = subprocess.run(['cat', os.path.join(mounts[0], 'data', 'small')], preexec_fn=as_nobody,
                           capture_output=True, text=True)
        t.check(r.returncode != 0 and 'from the image' not in r.stdout,
                f'a host user reading the snapshot of a running task: {r.stdout!r} {r.stderr!r}')
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)


def check_user_namespace(store):
    r, _ = run(store, '--user-namespace', '300000', 'img', '--', '/probe', 'uidmap')
    t.check(r.out.split()[:4] == ['uidmap', '0', '300000', '65536'] and 'uid 0' in r.out,
            f'the ID map inside a user namespace: {r.out}')
    run(store, '--user-namespace', '300000', '--keep', '--name', 'userns1', 'img', '--', '/probe', 'write',
        '/made-inside', 'x')
    with store.mount('userns1', readonly=True) as m:
        st = os.lstat(m.p('made-inside'))
        t.check_equal(st.st_uid, 300000, 'the owner on the host of a file root made in a user namespace')
    store.delete('userns1')


def as_uid(uid):
    def become():
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    return become


def check_userns_dir_not_theirs(store):
    """With a user namespace, the sandbox's directory on the host is
    root's, which the namespace's root (the host's ID 300000) may only pass
    through: a user of that ID could otherwise swap the mount point for a
    symbolic link and have root mount the snapshot over a directory of the
    host. One such link left in the directory is refused."""
    own_dir = store.path + '-sandboxes/planted'
    target = store.new_dir('planted-target')
    t.write_file(os.path.join(target, 'mine'), b'the host\'s\n')
    os.makedirs(own_dir)
    os.chown(own_dir, 300000, 300000)
    os.symlink(target, os.path.join(own_dir, 'root'))
    r = store.run('run', '--user-namespace', '300000', '--name', 'planted', 'img', '--', '/probe', 'info',
                  expect=None)
    t.check(r.code != 0 and 'root did not make' in r.err, f'a run over a planted mount point:\n{r.describe()}')
    t.check(target not in t.mount_table() and os.listdir(target) == ['mine'],
            f'the target of the planted link after the run: {os.listdir(target)}')
    t.check('planted' not in store.names(), 'a snapshot left by the refused run')
    os.unlink(os.path.join(own_dir, 'root'))
    os.rmdir(own_dir)

    p = subprocess.Popen([t.tool(), '--store', store.path, 'run', '--user-namespace', '300000', '--name', 'theirs',
                          'img', '--', '/probe', 'trap-term', '60'],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        t.check_equal(p.stdout.readline(), 'trapping\n', 'the task before its directory is looked at')
        own_dir = store.path + '-sandboxes/theirs'
        st = os.lstat(own_dir)
        acl = os.getxattr(own_dir, 'system.posix_acl_access')
        entries = [struct.unpack('<HHI', acl[i:i + 8]) for i in range(4, len(acl), 8)]
        t.check_equal((st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)), (0, 0, '0o710'),
                      'owner, group and mode of the directory of a task in a user namespace')
        t.check((0x02, 1, 300000) in entries and (0x04, 0, 0xffffffff) in entries,
                f'the ACL of the directory lets the namespace\'s root alone pass: {entries}')
        r = subprocess.run(['mkdir', os.path.join(own_dir, 'x')], preexec_fn=as_uid(300000), capture_output=True,
                           text=True)
        t.check(r.returncode != 0 and not os.path.exists(os.path.join(own_dir, 'x')),
                f'the namespace\'s root on the host making a file in the sandbox\'s directory: {r.stderr}')
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
    t.check('theirs' not in store.names(), 'the snapshot of the task once it ended')


def unlimited_seconds(store, slow, probe, before=None):
    """The probe's time without a limit: the best of up to three runs, so
    that other work on the disk meanwhile (tests run in parallel) does
    not pass for the limit's effect; a limit that has none still shows."""
    best = None
    for _ in range(3):
        if before:
            before()
        r, _ = run(store, 'img', '--', '/probe', *probe)
        seconds = float(r.out.split()[2])
        best = seconds if best is None else min(best, seconds)
        if best < slow / 2:
            break
    return best


def check_io(store):
    limit = 6 * MiB
    drop_caches()
    r, limited = run(store, '--io-read-bps', str(limit), 'img', '--', '/probe', 'read', '/data/big')
    slow = float(r.out.split()[2])
    fast = unlimited_seconds(store, slow, ['read', '/data/big'], before=drop_caches)
    print(f'read {BIG >> 20} MiB: {slow:.2f} s under {limit >> 20} MiB/s (cgroup v{limited["cgroup_version"]}), '
          f'{fast:.2f} s without a limit (best of up to three); the sandbox read {limited["io_read_bytes"] >> 20} MiB from the disk',
          flush=True)
    t.check(limited['cgroup_version'] in (1, 2), 'an I/O controller was used')
    t.check(slow >= 0.7 * BIG / limit, f'a read under a limit of {limit} B/s took {slow:.2f} s')
    t.check(fast < slow / 2, f'without the limit the read took {fast:.2f} s, with it {slow:.2f} s')
    t.check(limited['io_read_bytes'] >= BIG * 0.9, 'the disk reads were charged to the sandbox')

    r, limited = run(store, '--io-write-bps', str(limit), 'img', '--', '/probe', 'writeback', '/data/out', '24')
    slow = float(r.out.split()[2])
    fast = unlimited_seconds(store, slow, ['writeback', '/data/out', '24'])
    print(f'write 24 MiB and fsync: {slow:.2f} s under {limit >> 20} MiB/s (cgroup v{limited["cgroup_version"]}), '
          f'{fast:.2f} s without a limit (best of up to three); the sandbox wrote {limited["io_write_bytes"] >> 20} MiB to the disk',
          flush=True)
    t.check(not any('write' in n for n in limited['not_applied']),
            f'the write limit was applied: {limited["not_applied"]}')
    t.check(slow >= 0.7 * 24 * MiB / limit, f'a write under a limit of {limit} B/s took {slow:.2f} s')
    t.check(fast < slow / 2, f'without the limit the write took {fast:.2f} s, with it {slow:.2f} s')
    t.check(limited['io_write_bytes'] >= 24 * MiB * 0.9, 'the disk writes were charged to the sandbox')


def check_io_on_btrfs():
    """A read limit holds for a store on btrfs too, whose files' device
    number is no block device's: the limit goes on the device it was
    mounted from. Skipped alone where no btrfs can be made."""
    try:
        with t.Store('sandbox-btrfs', init=False) as store, stream_test.btrfs_loop(store, 256) as fs:
            store.path = os.path.join(fs, 'store')
            store.run('init')
            store.create('base')
            with store.mount('base') as m:
                shutil.copy(probe_exe(), m.p('probe'))
                t.write_file(m.p('big'), t.random_bytes(8 * MiB, 3))
            store.snapshot('base', 'img', readonly=True)
            limit = 2 * MiB
            drop_caches()
            r, rep = run(store, '--io-read-bps', str(limit), 'img', '--', '/probe', 'read', '/big')
            seconds = float(r.out.split()[2])
            print(f'read 8 MiB from a store on btrfs: {seconds:.2f} s under {limit >> 20} MiB/s', flush=True)
            t.check_equal(rep['not_applied'], [], 'limits not applied to a store on btrfs')
            t.check(rep['cgroup_version'] in (1, 2), f'an I/O controller was used for a store on btrfs: {rep}')
            t.check(seconds >= 0.7 * 8 * MiB / limit, f'a read under a limit of {limit} B/s took {seconds:.2f} s')
    except t.Skip as e:
        print(f'a store on btrfs: skipped: {e}', flush=True)


def check_kept_under_write_limit(store):
    """What a task wrote and did not fsync is in its kept snapshot, though
    the server's last commit, after the task, goes at the pace of the
    task's own write limit; and the report counts that commit."""
    limit = MiB
    r, rep = run(store, '--keep', '--name', 'kept-limited', '--io-write-bps', str(limit), 'img', '--',
                 '/probe', 'xor', '/data/big', '/data/xored', timeout=300)
    t.check_equal(r.out.strip(), f'xor {BIG}', 'a task writing under a write limit')
    want = t.random_bytes(BIG, 9).translate(bytes(i ^ 0x5a for i in range(256)))
    with store.mount('kept-limited', readonly=True) as m:
        got = t.read_file(m.p('data', 'xored'))
    t.check(got == want, f'the kept snapshot holds what the task wrote under a write limit: {len(got)} bytes '
            f'of {len(want)}, {"the same" if got == want[:len(got)] else "others"}')
    t.check(rep['io_write_bytes'] >= BIG * 0.9,
            f'the report counts the writes of the last commit: {rep["io_write_bytes"]} bytes')
    store.delete('kept-limited')


def check_limits(store):
    _, rep = run(store, '--memory-max', '32M', 'img', '--', '/probe', 'alloc', '256', expect=137)
    t.check(rep['oom_killed'], f'a task past its memory limit: {rep}')

    # The limit is on the task's processes: it and 31 children.
    r, rep = run(store, '--pids-max', '32', 'img', '--', '/probe', 'forkbomb', expect=None)
    t.check('forkbomb stopped 31 ' in r.out and rep['pids_limit_hit'], f'a fork bomb: {r.out} {rep}')
    subprocess.run(['true'], check=True)   # the host still forks
    # More than the kernel ever gives out is no limit, not an error.
    _, rep = run(store, '--pids-max', str(2**63 - 1), 'img', '--', '/probe', 'info')
    t.check(not any('pids' in n or 'process' in n for n in rep['not_applied']),
            f'a process limit past the kernel\'s: {rep["not_applied"]}')

    start = time.monotonic()
    _, rep = run(store, '--timeout', '1', 'img', '--', '/probe', 'sleep', '60', expect=137)
    t.check(rep['timed_out'] and time.monotonic() - start < 20, f'a task past its time limit: {rep}')


def check_disk_limit(store):
    """--disk-max: the snapshot's files may grow by that much and no more
    (EDQUOT), whatever the image holds."""
    r, _ = run(store, '--disk-max', '2M', 'img', '--', '/probe', 'writeback', '/new', '4')
    t.check_equal(r.out.strip(), 'writeback EDQUOT', 'a task writing 4 MiB under --disk-max 2M')
    r, _ = run(store, '--disk-max', '8M', '--keep', '--name', 'limited', 'img', '--', '/probe', 'writeback',
               '/new', '4')
    t.check(r.out.startswith('writeback 4194304 '), f'a task writing 4 MiB under --disk-max 8M: {r.out}')
    info = store.show('limited')
    t.check_equal(info['quota_bytes'], store.show('img')['logical_bytes'] + 8 * MiB,
                  'the quota of a snapshot run with --disk-max 8M')
    store.delete('limited')


def check_escapes(store):
    for args, want in ((['mount'], 'mount EPERM'), (['module'], 'module EPERM'),
                       (['unshare'], 'unshare EPERM'), (['ptrace', '1'], 'ptrace EPERM'),
                       (['ptrace', str(os.getpid())], 'ptrace E'),
                       # The host's kernel knobs: root could run a program of
                       # its own as the host's root through core_pattern.
                       (['sysctl', '/proc/sys/kernel/core_pattern'], 'sysctl EROFS'),
                       # A node it makes (CAP_MKNOD) opens no device.
                       (['mknod'], 'mknod-open EACCES'),
                       (['clone-ns'], 'clone-ns EPERM'), (['clone3-ns'], 'clone3-ns ENOSYS')):
        r, _ = run(store, 'img', '--', '/probe', *args)
        t.check(r.out.startswith(want), f'{args} inside a sandbox: {r.out}')
    # personality(): the personas of 32-bit builds (linux32, setarch i686
    # --uname-2.6) and the query get through; the flags that undo the
    # kernel's mitigations do not, alone, with a persona, with bit 31 or
    # past the 32 bits the kernel reads.
    allowed = ['0', '8', '20000', '20008', 'ffffffff']
    refused = ['400000', '40008', '100000', '80000008', '80400000', 'fffffffe', '7fffffff', '100000008',
               'ffffffffffffffff', '1']
    r, _ = run(store, 'img', '--', '/probe', 'personality', *allowed, *refused)
    t.check_equal(r.out.split(), ['personality'] + ['ok'] * len(allowed) + ['EPERM'] * len(refused),
                  f'personalities {allowed} then {refused} inside a sandbox')

    # vsock knows no network namespace: refused, but with the host's network.
    try:
        socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).close()
        for args, want in (([], 'vsock EPERM'), (['--host-network'], 'vsock ok')):
            r, _ = run(store, *args, 'img', '--', '/probe', 'vsock')
            t.check_equal(r.out.strip(), want, f'an AF_VSOCK socket in a sandbox run with {args}')
    except OSError as e:
        print(f'vsock: this host has none ({e}); skipped', flush=True)

    # What tells of the host's kernel is masked, as container engines do.
    for name in ('timer_list', 'keys', 'kpageflags', 'kpagecount', 'kpagecgroup'):
        if os.path.exists(f'/proc/{name}'):
            r, _ = run(store, 'img', '--', '/probe', 'read', f'/proc/{name}')
            t.check(r.out.startswith('read 0 '), f'/proc/{name} inside a sandbox: {r.out}')
    # An image whose /tmp leads elsewhere is refused: its link would be
    # followed on the host, before the root changes.
    store.create('linked')
    with store.mount('linked') as m:
        shutil.copy(probe_exe(), m.p('probe'))
        os.symlink('/', m.p('tmp'))
    r = store.run('run', 'linked', '--', '/probe', 'info', expect=1)
    t.check('/tmp is a symbolic link' in r.err, f'an image whose /tmp is a symbolic link:\n{r.err}')
    store.delete('linked')

    r, _ = run(store, 'img', '--', '/probe', 'chroot-escape')
    t.check('usr absent' in r.out, f'a chroot escape reached the host: {r.out}')

    # The task's cgroups are its namespace's root: no host path shows.
    r, _ = run(store, 'img', '--', '/probe', 'cgroup')
    words = r.out.split()
    t.check(words[:1] == ['cgroups'] and len(words) > 1 and all(w == '/' for w in words[1:]),
            f'the cgroups a task sees: {r.out}')

    # A directory the caller left open is no way out of the root.
    fd = os.open('/', os.O_RDONLY | os.O_DIRECTORY)
    try:
        p = subprocess.run([t.tool(), '--store', store.path, 'run', 'img', '--', '/probe', 'fds'], pass_fds=(fd,),
                           capture_output=True, text=True, timeout=120)
    finally:
        os.close(fd)
    t.check_equal(p.stdout.strip(), 'fds 0', f'descriptors a task inherits ({p.stderr.strip()})')

    workdir = store.new_dir('workdir')
    victim = os.path.join(store.tmp, 'victim')
    t.write_file(victim, b'host file\n')
    r, _ = run(store, '--workdir', workdir, 'img', '--', '/bin/sh', '-c',
               f'cat /data/../{os.path.relpath(victim, "/")} >/dev/null 2>&1; echo x > {victim}; '
               f'echo written > {workdir}/data/small; cat {workdir}/data/small', expect=None)
    t.check_equal(t.read_file(victim), b'host file\n', 'a host file after a workdir sandbox wrote to it')
    t.check('written' in r.out, f'the workdir sandbox writes its working tree: {r.out} {r.err}')

    # The host seen read-only opens none of its device nodes, and hides
    # the sockets of its daemons in /run (/etc/resolv.conf still reads).
    node = os.path.join(store.tmp, 'null-node')
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    sock = socket.socket(socket.AF_UNIX)
    sock_path = f'/run/cowbox-test-{os.getpid()}.sock'
    sock.bind(sock_path)
    sock.listen(1)
    try:
        r, _ = run(store, '--workdir', workdir, 'img', '--', '/bin/sh', '-c',
                   f'if echo x > {node}; then echo node opened; else echo node refused; fi; '
                   f'if test -S {sock_path}; then echo socket seen; else echo socket hidden; fi; '
                   'cat /etc/resolv.conf >/dev/null && echo resolv read', expect=None)
    finally:
        sock.close()
        os.unlink(sock_path)
    t.check('node refused' in r.out, f'a host device node from a workdir sandbox: {r.out} {r.err}')
    t.check('socket hidden' in r.out, f'a host socket in /run from a workdir sandbox: {r.out} {r.err}')
    if os.access('/etc/resolv.conf', os.R_OK):
        t.check('resolv read' in r.out, f'/etc/resolv.conf in a workdir sandbox: {r.out} {r.err}')

    # A subvolume mounted on the host, as a developer's workspace is, is
    # the store's as much as the store's own files: hidden too. In a user
    # namespace, where the host's mounts cannot be detached, it is covered
    # (its path is one the namespace's root may pass through, as a
    # workspace's is).
    store.snapshot('img', 'mounted-elsewhere')
    with store.mount('mounted-elsewhere') as m:
        t.write_file(m.p('secret'), b'a developer\'s file\n')
        r, _ = run(store, '--workdir', workdir, 'img', '--', '/bin/sh', '-c',
                   f'cat {m.p("secret")} 2>/dev/null || echo hidden; grep -c fuse.cowbox /proc/self/mountinfo',
                   expect=None)
        userns, _ = run(store, '--workdir', workdir, '--user-namespace', '300000', 'img', '--', '/bin/sh', '-c',
                        f'cat {m.p("secret")} 2>/dev/null || echo hidden; ls -A {m.path} && echo listed',
                        expect=None)
    store.delete('mounted-elsewhere')
    t.check_equal(r.out.split(), ['hidden', '1'],
                  f'a subvolume mounted on the host, from a workdir sandbox (only its own is seen): {r.err}')
    t.check_equal(userns.out.split(), ['hidden', 'listed'],
                  f'a subvolume mounted on the host, from a workdir sandbox in a user namespace: {userns.err}')

    # A working tree's path through a symbolic link would be looked up on
    # the writable host: refused, and nothing made there.
    target = store.new_dir('link-target')
    os.symlink(target, os.path.join(store.tmp, 'link'))
    r = store.run('run', '--workdir', os.path.join(store.tmp, 'link', 'sub'), 'img', '--', '/probe', 'info',
                  expect=1)
    t.check('symbolic link' in r.err, f'a working tree through a symbolic link:\n{r.err}')
    t.check_equal(os.listdir(target), [], 'the directory a working tree\'s symbolic link points to')

    # The host's root, however written, is no working tree: it would be
    # writable from inside.
    for path in ('//', '/.', '/./'):
        r = store.run('run', '--workdir', path, 'img', '--', '/probe', 'info', expect=1)
        t.check('working tree' in r.err, f'the working tree {path!r}:\n{r.err}')


def sandbox_cgroups(name):
    """The cgroup directories of the sandbox name, in every hierarchy."""
    found = set()
    with open('/proc/self/cgroup') as f:
        for line in f:
            own = line.rstrip('\n').split(':', 2)[2]
            for top in ['/sys/fs/cgroup'] + glob.glob('/sys/fs/cgroup/*'):
                for path in glob.glob(glob.escape(os.path.normpath(f'{top}/{own}/cowbox/{name}')) + '.*'):
                    if os.path.isdir(path):
                        found.add(path)
    return sorted(found)


def start_killed_run(store, *args):
    """Starts cowbox-store run ARGS of a task that sleeps, and kills it with
    -9 once the task's snapshot is mounted: the task dies with it (PID
    namespace), and so does the server of its snapshot. Returns the
    process and the mounts left."""
    base = store.path + '-sandboxes/'

    def mounts():
        return [m for m in t.mount_table() if m.startswith(base)]

    p = subprocess.Popen([t.tool(), '--store', store.path, 'run', *args, 'img', '--', '/probe', 'sleep', '60'],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not mounts() and time.monotonic() < deadline:
        time.sleep(0.1)
    t.check(mounts(), 'the snapshot of a running task is mounted')
    time.sleep(0.5)
    p.kill()
    p.wait()
    deadline = time.monotonic() + 15
    while mounts() and time.monotonic() < deadline:
        time.sleep(0.1)
    return p, mounts()


def check_caller_killed(store):
    """kill -9 of cowbox-store run leaves no mount and no task behind; the
    next run removes the rest: the snapshot (unless it was kept under a
    name of the caller's), the cgroups and the run's record."""
    base = store.path + '-sandboxes/'
    p, left_mounts = start_killed_run(store)
    t.check_equal(left_mounts, [], 'mounts of a task whose caller was killed')
    name = [n for n in store.names() if n.startswith(f'sandbox-{p.pid}-')]
    t.check_equal(len(name), 1, 'the snapshot of a task whose caller was killed, before the next run')
    name = name[0]
    t.check(sandbox_cgroups(name), f'cgroups of {name} before the next run')
    t.check(os.path.exists(f'{base}{name}.run'), f'the record of {name} before the next run')

    kept, _ = start_killed_run(store, '--keep', '--name', 'killed-kept')
    t.check('killed-kept' in store.names(), 'a kept snapshot of a killed caller')
    # Deleted by hand, and its name given to a subvolume of the user's: that
    # one is not the killed run's to remove.
    start_killed_run(store, '--name', 'reused')
    store.delete('reused', reap=False)
    store.create('reused')

    run(store, 'img', '--', '/probe', 'info')
    t.check(name not in store.names(), f'{name} after the next run: {store.names()}')
    t.check('killed-kept' in store.names(), 'a snapshot kept under a chosen name, after the next run')
    t.check('reused' in store.names(), 'a subvolume that took the name of a killed run\'s snapshot')
    for n in (name, 'killed-kept'):
        t.check_equal(sandbox_cgroups(n), [], f'cgroups of {n} after the next run')
        t.check_equal(sorted(e for e in os.listdir(base) if e.startswith(n)), [],
                      f'what the run of {n} left in {base}')
    store.delete('killed-kept')
    store.delete('reused')

    # A run of an earlier version killed after it made its snapshot,
    # before its record named it: the name it made up of its PID goes too,
    # and only such a name.
    dead = subprocess.Popen(['true'])
    dead.wait()
    boot_id = open('/proc/sys/kernel/random/boot_id').read().strip()
    pidns = os.stat('/proc/self/ns/pid').st_ino
    made_up = f'sandbox-{dead.pid}-0'
    for name in (made_up, 'not-made-up'):
        store.snapshot('img', name)
        with open(f'{base}{name}.run', 'w') as f:
            f.write(f'owner {dead.pid} 1 {boot_id} {pidns}\nmade-up {name}\n')
    run(store, 'img', '--', '/probe', 'info')
    t.check(made_up not in store.names() and 'not-made-up' in store.names(),
            f'subvolumes after the records of a run killed before its snapshot\'s line: {store.names()}')
    t.check(not os.path.exists(f'{base}{made_up}.run'), 'the record of a run killed before its snapshot\'s line')
    store.delete('not-made-up')

    # kill -9 of a run under a chosen name at each of its first writes after
    # the record's first line (a record still empty is taken for one being
    # written for a minute): wherever it dies, the next run leaves no
    # snapshot of that name behind, and none of its cgroups. strace stops the runner as it enters
    # the write and kills it before the write is done.
    if not shutil.which('strace'):
        print('SKIP: kills at each write of a run: strace is not installed')
        return
    for path in sandbox_cgroups('killed-at-write'):
        os.rmdir(path)      # left by a run of an older build, which wrote them down after it made them
    for n in range(2, 10):
        p = subprocess.run(['strace', '-qq', '-o', '/dev/null', '-e', 'trace=write',
                            '-e', f'inject=write:error=EIO:signal=SIGKILL:when={n}',
                            t.tool(), '--store', store.path, 'run', '--name', 'killed-at-write', 'img', '--',
                            '/probe', 'info'], capture_output=True, timeout=120)
        if n == 2:
            t.check(p.returncode != 0, f'a run killed at its write {n}: exit {p.returncode}')
        run(store, 'img', '--', '/probe', 'info')
        t.check('killed-at-write' not in store.names(),
                f'the snapshot of a run killed at its write {n}, after the next run: {store.names()}')
        t.check(not os.path.exists(f'{base}killed-at-write.run'), f'the record of a run killed at its write {n}')
        t.check_equal(sandbox_cgroups('killed-at-write'), [], f'cgroups of a run killed at its write {n}')


def report_of(stderr):
    return json.loads(stderr[stderr.find('{'):stderr.rfind('}') + 1])


def check_delegated_cgroup(store):
    """Run from a cgroup delegated to it (systemd-run --scope -p
    Delegate=yes), cowbox-store run moves into a leaf of it, so that the
    delegated cgroup holds no process and may hand controllers down, and
    makes the sandbox's v2 cgroup below the delegated one, not below the
    leaf. What a killed run left there is removed by the next run. A limit
    that the host cannot apply is reported with its real cause: here, the
    v2 tree offers neither io nor memory (its root's cgroup.controllers)."""
    cg = t.delegated_cgroup('sandbox')
    if not cg:
        return
    base = store.path + '-sandboxes/'
    try:
        p = subprocess.Popen([t.tool(), '--store', store.path, 'run', '--memory-max', '64M', 'img', '--',
                              '/probe', 'sleep', '60'], preexec_fn=cg.enter, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        made = []

        # The task joins its cgroup after the snapshot is mounted: wait for
        # it there too (a slow build, ASan's, gets that far later).
        def sandbox_made():
            made[:] = cg.children('cowbox')
            return (len(made) == 1 and cg.procs(os.path.join('cowbox', made[0])) and
                    any(m.startswith(base) for m in t.mount_table()))
        deadline = time.monotonic() + 30
        while not sandbox_made() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        with open(f'/proc/{p.pid}/cgroup') as f:
            v2 = [line.rstrip('\n').split(':', 2)[2] for line in f if line.startswith('0::')]
        t.check_equal(v2, [cg.name + '/supervisor'], 'the v2 cgroup of a run started in a delegated cgroup')
        t.check_equal(cg.procs(), [], 'processes left in the delegated cgroup itself')
        t.check_equal(len(made), 1, f'sandbox cgroups below the delegated cgroup: {made}')
        t.check(cg.procs(os.path.join('cowbox', made[0])), 'the task in its cgroup below the delegated one')
        t.check_equal(cg.children('supervisor'), [], 'cgroups below the leaf')
        records = [e for e in os.listdir(base) if e.endswith('.run')]
        text = ''.join(open(base + e).read() for e in records)
        t.check(f'cgroup {cg.path}/cowbox/{made[0]}\n' in text, f'the run\'s record names its v2 cgroup:\n{text}')

        # kill -9: the next run removes the sandbox's cgroup, not the leaf.
        p.kill()
        p.wait()
        t.check(os.path.isdir(os.path.join(cg.path, 'cowbox', made[0])), 'the cgroup a killed run left')
        run(store, 'img', '--', '/probe', 'info')
        t.check_equal(cg.children('cowbox'), [], 'cgroups below the delegated one after the next run')
        t.check(os.path.isdir(os.path.join(cg.path, 'supervisor')), 'the leaf after the next run')

        # Started in the leaf already (systemd's DelegateSubgroup=): the
        # sandbox's cgroup is below the delegated cgroup all the same.
        p = subprocess.Popen([t.tool(), '--store', store.path, 'run', 'img', '--', '/probe', 'sleep', '60'],
                             preexec_fn=lambda: cg.enter('supervisor'), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not sandbox_made() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        p.kill()
        p.wait()
        t.check_equal((len(made), cg.children('supervisor')), (1, []),
                      'cgroups of a run started in the leaf, below the delegated cgroup and the leaf')
        run(store, 'img', '--', '/probe', 'info')

        # This host's v2 tree offers neither io nor memory: the I/O latency
        # and, with no v1 hierarchy for memory either, the memory limit say
        # so.
        offered = open(os.path.join(cg.mount, 'cgroup.controllers')).read().split()
        if 'io' in offered or 'memory' in offered:
            print(f'SKIP: reasons for limits not applied: the cgroup v2 tree offers {offered} here')
            return
        r = subprocess.run([t.tool(), '--store', store.path, '--json', 'run', '--memory-max', '64M', '--io-latency',
                            '1000', 'img', '--', '/probe', 'info'], preexec_fn=cg.enter, capture_output=True,
                           text=True, timeout=120)
        t.check_equal(r.returncode, 0, f'a run in a delegated cgroup: {r.stderr}')
        reasons = report_of(r.stderr)['not_applied']
        memory_v1 = [m for m, fs in t.mount_table().items() if fs == 'cgroup' and
                     os.path.exists(os.path.join(m, 'memory.limit_in_bytes'))]
        if memory_v1:
            t.check(not any('memory' in n for n in reasons), f'a memory limit held by cgroup v1: {reasons}')
        t.check(any(n.startswith('I/O latency:') and 'this host lacks' in n for n in reasons),
                f'the reason an I/O latency target is not applied: {reasons}')
        t.check(not any('holds processes' in n for n in reasons), f'reasons of a run in a delegated cgroup: '
                f'{reasons}')
        umounts = ' && '.join(f'umount {shlex.quote(m)}' for m in memory_v1)
        r = subprocess.run(['unshare', '-m', 'sh', '-c', f'{umounts or "true"} && exec "$@"', 'sh', t.tool(),
                            '--store', store.path, '--json', 'run', '--memory-max', '64M', 'img', '--', '/probe',
                            'info'], capture_output=True, text=True, timeout=120)
        t.check_equal(r.returncode, 0, f'a run without a v1 memory hierarchy: {r.stderr}')
        reasons = report_of(r.stderr)['not_applied']
        t.check(any(n.startswith('memory limit: the host has no memory controller') and 'cgroup.controllers' in n
                    for n in reasons), f'the reason a memory limit is not applied on a host without one: {reasons}')
    finally:
        cg.close()


def check_exit_and_signals(store, tmp):
    """The report tells an exit status above 128 from a signal; SIGTERM to
    cowbox-store run reaches the task, whose end is reported, and the run
    cleans up; the task's output goes to the caller's files also in a user
    namespace."""
    for status in (255, 130):
        _, rep = run(store, 'img', '--', '/probe', 'exit', str(status), expect=status)
        t.check_equal((rep['exit_status'], rep['signal']), (status, 0), f'the report of exit {status}')
    _, rep = run(store, 'img', '--', '/probe', 'raise', '10', expect=138)
    t.check_equal((rep['exit_status'], rep['signal']), (138, 10), 'the report of a task killed by SIGUSR1')

    before = store.names()
    p = subprocess.Popen([t.tool(), '--store', store.path, '--json', 'run', 'img', '--', '/probe', 'trap-term', '60'],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t.check_equal(p.stdout.readline(), 'trapping\n', 'the task before SIGTERM')
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    t.check_equal((p.returncode, out), (7, 'caught\n'), f'a task sent SIGTERM through its run: {err}')
    rep = json.loads(err[err.find('{'):err.rfind('}') + 1])
    t.check_equal((rep['exit_status'], rep['signal']), (7, 0), 'the report of a task that caught SIGTERM')
    t.check_equal(store.names(), before, 'subvolumes after a run ended by SIGTERM')

    # Sent while the sandbox is being made, it is passed on as soon as
    # there is a task: the task ends at once, by its handler or by the
    # signal, never after its full sleep (or, sent before cowbox-store set
    # its handlers, it ends cowbox-store before it made anything).
    for delay in (0.02, 0.05, 0.1, 0.2):
        start = time.monotonic()
        p = subprocess.Popen([t.tool(), '--store', store.path, 'run', 'img', '--', '/probe', 'trap-term', '30'],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGTERM)
        p.wait(60)
        t.check(p.returncode in (7, 128 + signal.SIGTERM, -signal.SIGTERM) and time.monotonic() - start < 15,
                f'SIGTERM {delay} s into a run: exit status {p.returncode} after {time.monotonic() - start:.1f} s')
    t.check_equal(store.names(), before, 'subvolumes after runs ended by SIGTERM early')

    out_path = os.path.join(tmp, 'userns-out')
    run(store, '--user-namespace', '300000', '--stdout', out_path, 'img', '--', '/probe', 'uidmap')
    t.check(t.read_file(out_path).split()[:3] == [b'uidmap', b'0', b'300000'],
            f'the output of a task in a user namespace: {t.read_file(out_path)!r}')
    t.check_equal(os.stat(out_path).st_uid, os.getuid(), 'the owner of a task\'s output file')


def reap_all(store):
    deadline = time.monotonic() + 30
    store.reap()
    while store.usage()['reclaimable_bytes'] > 0 and time.monotonic() < deadline:
        store.reap()
        time.sleep(0.3)


def check_many(store):
    reap_all(store)     # what the earlier checks left
    before = store.usage()

    def one(i):
        r, rep = run(store, '--name', f'task{i}', 'img', '--', '/probe', 'mark', str(i))
        return i, r.out.split()[1:], rep

    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(one, range(20)))
    for i, marks, rep in results:
        t.check_equal(marks, [str(i)], f'task {i} sees only its own change')
        t.check_equal(rep['exit_status'], 0, f'task {i} exit status')
    reap_all(store)
    after = store.usage()
    t.check_equal(after['reclaimable_bytes'], 0, 'reclaimable bytes after 20 tasks')
    t.check_equal(after['data_bytes'], before['data_bytes'], 'data bytes after 20 tasks')
    t.check_equal(sorted(s['name'] for s in store.list()), ['base', 'img'], 'subvolumes after 20 tasks')


def run_test():
    t.require_fuse()
    t.require_root('namespaces and cgroups')
    if not os.path.exists(probe_exe()):
        t.fail(f'{probe_exe()} is missing: build first')
    with t.Store('sandbox') as store:
        make_image(store)
        check_inside(store)
        check_user_namespace(store)
        check_userns_dir_not_theirs(store)
        check_host_users_kept_out(store)
        check_io(store)
        check_kept_under_write_limit(store)
        check_limits(store)
        check_disk_limit(store)
        check_escapes(store)
        check_caller_killed(store)
        check_delegated_cgroup(store)
        check_exit_and_signals(store, store.tmp)
        check_many(store)
        store.fsck()
    check_io_on_btrfs()


if __name__ == '__main__':
    t.main(run_test)
