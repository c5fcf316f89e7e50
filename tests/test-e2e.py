#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The build farm's day through cowboxd: an image arrives as a send stream,
20 per-patch tasks run at once, each in its own snapshot (cowbox run), every
result is checked and none saw another's change; a task is cancelled; the
daemon is killed with -9 while a task runs and restarted, and nothing of
that task is left; everything is deleted, reaped, and the store's usage is
back to where it started. A daemon started in a delegated cgroup (its unit's
Delegate=yes) runs tasks in cgroups below it."""

import concurrent.futures
import json
import os
import shlex
import re
import shutil
import signal
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
import daemon_test as d  # noqa: E402


def probe_exe():
    return os.path.join(os.environ.get('COWBOX_BUILD_ROOT', 'build'), 'tests', 'sandbox-probe')


def make_stream(tmp):
    """A stream of an image with the probe program, made by another store."""
    stream = os.path.join(tmp, 'image.stream.zst')
    with t.Store('e2e-source') as source:
        source.create('work')
        with source.mount('work') as m:
            shutil.copy(probe_exe(), m.p('probe'))
            t.write_file(m.p('README'), b'a checkout\n')
        source.snapshot('work', 'checkout', readonly=True)
        source.run('send', '--zstd', '-f', stream, 'checkout')
    return stream


def no_sandboxes_left(store):
    names = [s['name'] for s in store.list()]
    base = store.path + '-sandboxes'
    mounts = [m for m in t.mount_table() if m.startswith(base + '/')]
    return not any(n.startswith('sandbox-') for n in names) and not mounts


def check_sandbox_edges(bus, store):
    """A sandbox with the longest name runs (its hostname cut to fit); a
    run that fails before its task runs says why; callers of WaitSandbox
    that left the bus give their places up; a delete waits for its
    snapshot's holder without keeping the daemon from other calls; a
    stream's reader that goes away is reported as such."""
    name = 'n' * 64
    d.cowbox(bus, 'sandbox', 'create', name, '--image', 'checkout', '--', '/probe', 'info')
    d.cowbox(bus, 'sandbox', 'start', name)
    r = d.cowbox(bus, 'sandbox', 'wait', name)
    t.check(f'hostname {("sbx-" + name)[:64]} ' in r.out, f'the hostname of a sandbox with a 64-byte name:\n{r.out}')
    d.cowbox(bus, 'sandbox', 'rm', name)

    d.cowbox(bus, 'sandbox', 'create', 'broken', '--image', 'checkout', '--', '/no-such-program')
    d.cowbox(bus, 'sandbox', 'start', 'broken')
    r = d.cowbox(bus, 'sandbox', 'wait', 'broken', expect=1)
    t.check('failed' in r.err and '/no-such-program' in r.err, f'waiting for a run that failed:\n{r.err}')
    shown = d.cowbox(bus, 'sandbox', 'show', 'broken').out
    t.check(re.search(r'^Error: +.*/no-such-program', shown, re.M), f'cowbox sandbox show of a failed run:\n{shown}')
    d.cowbox(bus, 'sandbox', 'rm', 'broken')

    d.cowbox(bus, 'sandbox', 'create', 'waited', '--image', 'checkout', '--', '/probe', 'sleep', '60')
    d.cowbox(bus, 'sandbox', 'start', 'waited')
    env = dict(os.environ, **bus.env)
    leaving = [subprocess.Popen(['gdbus', 'call', '--system', '--timeout', '1', '--dest', 'org.cowbox1',
                                 '--object-path', '/org/cowbox1', '--method', 'org.cowbox1.Manager.WaitSandbox',
                                 'waited'], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(70)]
    for p in leaving:
        p.wait(60)
    waiter = subprocess.Popen([d.client_exe(), 'sandbox', 'wait', 'waited'], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    d.cowbox(bus, 'sandbox', 'kill', 'waited')
    _, err = waiter.communicate(timeout=60)
    t.check('Too many' not in err and 'exit status 137' in err, f'a wait after 70 callers that left:\n{err}')
    d.cowbox(bus, 'sandbox', 'rm', 'waited')

    d.cowbox(bus, 'sandbox', 'create', 'held', '--image', 'checkout', '--', '/probe', 'info')
    with store.mount('sbx-held'):
        deleting = subprocess.Popen([d.client_exe(), 'sandbox', 'rm', 'held'], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        started = time.monotonic()
        d.cowbox(bus, 'status')
        t.check(time.monotonic() - started < 2, 'the daemon answers while a delete waits for a snapshot\'s holder')
        t.check(deleting.poll() is None, 'a delete of a sandbox whose snapshot is mounted waits')
    _, err = deleting.communicate(timeout=30)
    t.check_equal((deleting.returncode, err), (0, ''), 'the delete once the snapshot was let go')
    t.check('held' not in d.cowbox(bus, 'sandbox', 'list').out, 'the deleted sandbox is gone')

    r = subprocess.run(f'{d.client_exe()} image send checkout | head -c 10 > /dev/null', shell=True, env=env,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    t.check('receiving end' in r.stderr, f'a send whose reader went away:\n{r.stderr}')


def check_client_arguments(bus):
    """Names after '--' are the ones acted on, also '--' and names that
    start with '-'; the bash completion offers the daemon's names."""
    d.cowbox(bus, 'snapshot', '--', 'checkout', '-lead')
    d.cowbox(bus, 'snapshot', '--', 'checkout', '--')
    d.cowbox(bus, 'snapshot', 'checkout', 'keep-me')
    t.check('-lead' in d.cowbox(bus, 'show', '--', '-lead').out, 'show -- -lead')
    d.cowbox(bus, 'rm', '--', 'keep-me')
    t.check_equal(d.names(bus), ['--', '-lead', 'checkout'], "subvolumes after 'rm -- keep-me'")
    d.cowbox(bus, 'rm', '--', '-lead')
    d.cowbox(bus, 'rm', '--', '--')
    t.check_equal(d.names(bus), ['checkout'], 'subvolumes after the removals')

    completion = os.path.join(t.source_root(), 'contrib', 'cowbox.bash-completion')
    path = os.path.dirname(d.client_exe()) + ':' + os.environ['PATH']
    for words, want in ((['image', 'show', ''], 'checkout'), (['sandbox', ''], 'show'),
                        (['run', ''], 'checkout'), (['image', 'send', '-p', ''], 'checkout')):
        quoted = ' '.join(shlex.quote(w) for w in words)
        script = (f'source {completion}; COMP_WORDS=(cowbox {quoted}); COMP_CWORD={len(words)}; _cowbox; '
                  'printf "%s\\n" "${COMPREPLY[@]}"')
        r = d.run(bus, ['env', f'PATH={path}', 'bash', '-c', script])
        t.check(want in r.out.split(), f'completion of cowbox {" ".join(words)} offers no {want}:\n{r.describe()}')


def check_delegated_daemon(stream):
    """cowboxd started in a cgroup delegated to it (Delegate=yes in its
    unit) moves into a leaf of it, so that the delegated cgroup holds no
    process and may hand controllers down, and makes its tasks' v2 cgroups
    below the delegated cgroup, not below its leaf. What a killed worker
    left there goes at the next start; the leaf stays, even where a record
    names it. Limits the host cannot apply say why: here, the v2 tree has
    no io controller; v1 holds the memory limit as before."""
    cg = t.delegated_cgroup('e2e')
    if not cg:
        return
    try:
        with t.Store('e2e-delegated') as store, d.bus_and_daemon(store, cgroup=cg) as (bus, daemon):
            t.check_equal(cg.procs(), [], 'processes in the delegated cgroup itself')
            t.check(daemon.proc.pid in cg.procs('supervisor'), f'the daemon in its leaf: {cg.procs("supervisor")}')
            d.cowbox(bus, 'image', 'receive', '-f', stream)
            r = d.cowbox(bus, '--json', 'run', '--memory-max', '64M', '--io-latency', '1000', 'checkout', '--',
                         '/probe', 'info')
            reasons = json.loads(r.out)['not_applied']
            offered = open(os.path.join(cg.mount, 'cgroup.controllers')).read().split()
            if 'io' not in offered:
                t.check(any(n.startswith('I/O latency:') and 'this host lacks' in n for n in reasons),
                        f'the reason an I/O latency target is not applied: {reasons}')
            if 'memory' not in offered:
                t.check(not any('memory' in n for n in reasons), f'a memory limit held by cgroup v1: {reasons}')

            client = subprocess.Popen([d.client_exe(), 'run', 'checkout', '--', '/probe', 'sleep', '60'],
                                      env=dict(os.environ, **bus.env), stderr=subprocess.DEVNULL)
            made = []

            def task_cgroup():
                made[:] = [c for c in cg.children('cowbox') if c.startswith('sandbox-')]
                return made and cg.procs(os.path.join('cowbox', made[0]))
            d.wait_for('the task to start in its cgroup below the delegated one', task_cgroup)
            d.cowbox(bus, 'reap')
            t.check('reaper' in cg.children('cowbox'), f'the reaper\'s cgroup: {cg.children("cowbox")}')
            t.check_equal(cg.children('supervisor'), [], 'cgroups below the daemon\'s leaf')
            worker = int(made[0].split('-')[1])
            t.check(worker in cg.procs('supervisor'), 'the task\'s worker in the daemon\'s leaf')
            os.kill(worker, signal.SIGKILL)
            client.wait(60)
            t.check(os.path.isdir(os.path.join(cg.path, 'cowbox', made[0])), 'the cgroup a killed worker left')
            # A record of a runner that is gone naming the daemon's leaf.
            dead = subprocess.Popen(['true'])
            dead.wait()
            boot_id = open('/proc/sys/kernel/random/boot_id').read().strip()
            with open(os.path.join(store.path + '-sandboxes', 'forged.run'), 'w') as f:
                f.write(f'owner {dead.pid} 1 {boot_id} {os.stat("/proc/self/ns/pid").st_ino}\n'
                        f'cgroup {cg.path}/supervisor\n')
            daemon.stop()
            daemon.start()
            d.wait_for('the killed worker\'s task to leave nothing',
                       lambda: no_sandboxes_left(store) and not os.path.exists(os.path.join(cg.path, 'cowbox',
                                                                                            made[0])))
            d.wait_for('the record naming the leaf to be gone',
                       lambda: not os.path.exists(os.path.join(store.path + '-sandboxes', 'forged.run')))
            t.check(daemon.proc.poll() is None and daemon.proc.pid in cg.procs('supervisor'),
                    f'the daemon alive in its leaf after its start: {open(daemon.log).read()[-2000:]}')
            d.cowbox(bus, 'run', 'checkout', '--', '/probe', 'info')
    finally:
        cg.close()


def run():
    d.require_dbus()
    t.require_fuse()
    with t.Store('e2e') as store:
        stream = make_stream(store.tmp)
        start = store.usage()
        with d.bus_and_daemon(store) as (bus, daemon):
            d.cowbox(bus, 'image', 'receive', '-f', stream)
            t.check_equal(d.names(bus), ['checkout'], 'images after the receive')
            check_client_arguments(bus)

            def task(i):
                r = d.cowbox(bus, 'run', '--memory-max', '256M', '--timeout', '120', 'checkout', '--',
                             '/probe', 'mark', str(i))
                return i, r.out.split()

            with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
                results = list(pool.map(task, range(20)))
            for i, words in results:
                t.check_equal(words, ['marks', str(i)], f'patch task {i} sees only its own change')
            d.wait_for('the snapshots of the tasks to go', lambda: no_sandboxes_left(store))

            # A report as JSON, with the task's output in it.
            r = d.cowbox(bus, '--json', 'run', '--pids-max', '64', 'checkout', '--', '/probe', 'info')
            report = json.loads(r.out)
            t.check(report['stdout'].startswith('pid 2 ppid 1'), f'the task\'s output in the report: {report}')
            t.check_equal(report['exit_status'], 0, 'exit status in the report')
            # Output past the 64 KiB kept, of characters JSON escapes six
            # times over: the report is far larger than its output.
            r = d.cowbox(bus, '--json', 'run', 'checkout', '--', '/probe', 'print', '100000')
            report = json.loads(r.out)
            t.check_equal(report['stdout'], '\x01' * 65536, 'the first 64 KiB of a long output in the report')

            # A cancelled task.
            client = subprocess.Popen([d.client_exe(), 'run', 'checkout', '--', '/probe', 'sleep', '60'],
                                      env=dict(os.environ, **bus.env), stderr=subprocess.PIPE, text=True)
            def run_jobs():
                return [j for j in json.loads(d.cowbox(bus, '--json', 'jobs').out) if j['type'] == 'run']

            d.wait_for('the task to start', run_jobs)
            job = run_jobs()[0]
            d.cowbox(bus, 'cancel', str(job['id']))
            _, err = client.communicate(timeout=60)
            t.check(client.returncode != 0, f'a cancelled task\'s client: {client.returncode} {err}')
            d.wait_for('the cancelled task to leave nothing', lambda: no_sandboxes_left(store))

            # A task whose caller is gone goes too, with its snapshot, also
            # one asked to keep it: nobody is left to learn its name.
            client = subprocess.Popen([d.client_exe(), 'run', '--keep', 'checkout', '--', '/probe', 'sleep', '60'],
                                      env=dict(os.environ, **bus.env), stderr=subprocess.DEVNULL)
            d.wait_for('the task to start', run_jobs)
            client.kill()
            client.wait()
            d.wait_for('the task of a caller that is gone to leave nothing',
                       lambda: not run_jobs() and no_sandboxes_left(store))

            # kill -9 of the daemon while a task runs.
            client = subprocess.Popen([d.client_exe(), 'run', 'checkout', '--', '/probe', 'sleep', '60'],
                                      env=dict(os.environ, **bus.env), stderr=subprocess.DEVNULL)
            d.wait_for('the task to start', lambda: any(n.startswith('sandbox-') for n in
                                                      (s['name'] for s in store.list())))
            time.sleep(1)
            daemon.kill(signal.SIGKILL)
            client.wait(60)
            daemon.start()
            d.wait_for('the killed daemon\'s task to leave nothing', lambda: no_sandboxes_left(store))
            t.check_equal(d.names(bus), ['checkout'], 'what the restarted daemon reports')

            # kill -9 of the worker that runs a task (as the OOM killer
            # would): the next start of the daemon removes what it left,
            # its snapshot, cgroups and files of output.
            client = subprocess.Popen([d.client_exe(), 'run', 'checkout', '--', '/probe', 'sleep', '60'],
                                      env=dict(os.environ, **bus.env), stderr=subprocess.DEVNULL)
            d.wait_for('the task to start', lambda: any(n.startswith('sandbox-') for n in
                                                      (s['name'] for s in store.list())))
            time.sleep(1)
            worker = [n for n in (s['name'] for s in store.list()) if n.startswith('sandbox-')][0].split('-')[1]
            os.kill(int(worker), signal.SIGKILL)
            client.wait(60)
            # Its files of output stay until the daemon starts again (its
            # snapshot and record may go sooner: a daemon that started
            # less than a minute ago looks for them every 2 s).
            left = sorted(os.listdir(store.path + '-sandboxes'))
            t.check(any(e.startswith(f'output-{worker}-') for e in left), f'what a killed worker left: {left}')
            # A worker that is a zombie is gone too; a live one keeps its files.
            zombie = subprocess.Popen(['true'])
            d.wait_for('a zombie', lambda: open(f'/proc/{zombie.pid}/stat').read().rsplit(')', 1)[1][1] == 'Z')
            live = f'output-{os.getpid()}-AbCdEf'
            for name in (f'output-{zombie.pid}-AbCdEf', live):
                open(os.path.join(store.path + '-sandboxes', name), 'w').close()
            daemon.stop()
            daemon.start()
            d.wait_for('the killed worker\'s task to leave nothing', lambda: no_sandboxes_left(store))
            left = [e for e in os.listdir(store.path + '-sandboxes') if not e.startswith('.')]
            t.check_equal(left, [live], 'files of sandboxes after a restart')
            os.unlink(os.path.join(store.path + '-sandboxes', live))
            zombie.wait()

            # Sandboxes with a life of their own: their snapshot stays theirs
            # between runs, a kill ends a run, a restart of the daemon
            # marks a run that died with it, and rm leaves nothing.
            d.cowbox(bus, 'sandbox', 'create', 'patch-a', '--image', 'checkout', '--pids-max', '64', '--',
                     '/probe', 'mark', 'a')
            r = d.run(bus, ['busctl', '--system', 'get-property', 'org.cowbox1', '/org/cowbox1/sandbox/patch_2da',
                            'org.cowbox1.Sandbox', 'State'])
            t.check_equal(r.out.strip(), 's "created"', 'the State of a sandbox object')
            d.gdbus_call(bus, 'Start', path='/org/cowbox1/sandbox/patch_2da', interface='org.cowbox1.Sandbox')
            r = d.cowbox(bus, 'sandbox', 'wait', 'patch-a')
            t.check_equal(r.out.split(), ['marks', 'a'], 'the first run of a sandbox')
            d.cowbox(bus, 'sandbox', 'start', 'patch-a')
            r = d.cowbox(bus, 'sandbox', 'wait', 'patch-a')
            t.check_equal(r.out.split(), ['marks', 'a'], 'the second run sees the first one\'s change')
            d.cowbox(bus, 'sandbox', 'create', 'patch-b', '--image', 'checkout', '--', '/probe', 'sleep', '60')
            d.cowbox(bus, 'sandbox', 'start', 'patch-b')
            d.cowbox(bus, 'sandbox', 'kill', 'patch-b')
            r = d.cowbox(bus, 'sandbox', 'wait', 'patch-b', expect=None)
            t.check(r.code != 0, f'waiting for a killed sandbox: {r.describe()}')
            d.cowbox(bus, 'sandbox', 'start', 'patch-b')
            time.sleep(1)
            daemon.kill(signal.SIGKILL)
            daemon.start()
            states = {b['name']: b['state'] for b in json.loads(d.cowbox(bus, '--json', 'sandbox', 'list').out)}
            t.check_equal(states, {'patch-a': 'exited', 'patch-b': 'failed'}, 'sandboxes after kill -9 of the daemon')
            lines = d.cowbox(bus, 'sandbox', 'list').out.splitlines()
            t.check_equal(lines[0].split(), ['NAME', 'STATE', 'IMAGE', 'EXIT'], 'the header of cowbox sandbox list')
            t.check_equal(sorted(line.split()[:3] for line in lines[1:]),
                          [['patch-a', 'exited', 'checkout'], ['patch-b', 'failed', 'checkout']],
                          'the rows of cowbox sandbox list')
            shown = d.cowbox(bus, 'sandbox', 'show', 'patch-a').out
            for pattern in (r'^State: +exited$', r'^Image: +checkout$', r'^Command: +/probe mark a$', r'^Exit: +0$'):
                t.check(re.search(pattern, shown, re.M), f'{pattern} in cowbox sandbox show:\n{shown}')
            for name in ('patch-a', 'patch-b'):
                d.cowbox(bus, 'sandbox', 'rm', name)
            check_sandbox_edges(bus, store)
            r = d.cowbox(bus, 'sandbox', 'show', 'patch-a', expect=1)
            t.check("no sandbox 'patch-a'" in r.err, f'cowbox sandbox show of a removed sandbox:\n{r.err}')
            d.wait_for('the sandboxes to leave nothing', lambda: no_sandboxes_left(store) and not any(
                n.startswith('sbx-') for n in store.names()))

            # Everything goes, and the space comes back.
            d.cowbox(bus, 'image', 'rm', 'checkout')
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                d.cowbox(bus, 'reap')
                if store.usage()['reclaimable_bytes'] == 0:
                    break
                time.sleep(0.5)
        end = store.usage()
        for key in ('reclaimable_bytes', 'logical_bytes', 'data_bytes'):
            t.check_equal(end[key], start[key], f'{key} at the end')
        t.check_equal(store.names(), [], 'subvolumes at the end')
        store.fsck()
        check_delegated_daemon(stream)


if __name__ == '__main__':
    t.main(run)
