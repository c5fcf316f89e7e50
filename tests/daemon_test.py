# SPDX-License-Identifier: LGPL-2.1-or-later
"""A private system bus (dbus-daemon) and cowboxd on it, for the tests of
the daemon: both are started in the test's temporary directory and stopped
at the end, whatever happens."""

import contextlib
import json
import os
import re
import signal
import subprocess
import time

import cowbox_test as t

BUS_CONFIG = '''<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
  </policy>
  {policy}
</busconfig>
'''

POLICY_GROUP = 'cowbox'    # the group contrib/org.cowbox1.conf lets call cowboxd

# A bus that lets everyone call everything: what cowboxd checks itself.
OPEN_POLICY = '''<policy context="default">
    <allow own="*"/>
    <allow send_destination="*"/>
  </policy>'''


def daemon_exe():
    return os.path.join(os.environ.get('COWBOX_BUILD_ROOT', 'build'), 'daemon', 'cowboxd')


def client_exe():
    return os.path.join(os.environ.get('COWBOX_BUILD_ROOT', 'build'), 'cli', 'cowbox')


def require_dbus():
    t.require_root('a private system bus and a daemon that owns a store')
    for p in ('dbus-daemon', 'busctl', 'gdbus', 'dbus-send'):
        t.require_program(p)


class Bus:
    """A private dbus-daemon of type system; policy 'contrib' includes the
    project's bus policy, 'open' lets everyone call everything, 'none' is a
    system bus's own policy alone (the project's not installed)."""

    def __init__(self, store, policy='contrib'):
        self.dir = store.new_dir('bus')
        self.socket = os.path.join(self.dir, 'socket')
        if policy == 'contrib':
            # The policy names the group: dbus-daemon drops the rules of a
            # group that does not exist when it reads them.
            ensure_group(POLICY_GROUP)
            text = f'<include>{os.path.join(t.source_root(), "contrib", "org.cowbox1.conf")}</include>'
        elif policy == 'none':
            text = ''
        else:
            text = OPEN_POLICY
        self.config = os.path.join(self.dir, 'bus.conf')
        with open(self.config, 'w') as f:
            f.write(BUS_CONFIG.format(socket=self.socket, policy=text))
        self.proc = subprocess.Popen(['dbus-daemon', '--config-file', self.config, '--nofork', '--nopidfile'],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(100):
            if os.path.exists(self.socket):
                break
            time.sleep(0.05)
        else:
            t.fail('dbus-daemon did not start: ' + self.proc.stderr.read().decode())
        os.chmod(self.dir, 0o755)
        self.address = f'unix:path={self.socket}'
        self.env = {'DBUS_SYSTEM_BUS_ADDRESS': self.address}

    def stop(self):
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


class Daemon:
    def __init__(self, store, bus, args=(), env=None, cgroup=None):
        self.store = store
        self.bus = bus
        self.args = list(args)
        self.env = env or {}
        self.cgroup = cgroup    # a t.DelegatedCgroup to start in
        self.proc = None
        self.log = os.path.join(store.tmp, 'cowboxd.log')

    def start(self):
        env = dict(os.environ, **self.bus.env, **self.env)
        self.proc = subprocess.Popen([daemon_exe(), '--store', self.store.path] + self.args, env=env,
                                     stdout=open(self.log, 'a'), stderr=subprocess.STDOUT,
                                     preexec_fn=self.cgroup.enter if self.cgroup else None)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            r = subprocess.run(['busctl', '--system', 'status', 'org.cowbox1'], env=env, capture_output=True,
                               text=True)
            # The name, and owned by this daemon (not one that is dying).
            if r.returncode == 0 and f'PID={self.proc.pid}\n' in r.stdout:
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        owner = subprocess.run(['busctl', '--system', 'status', 'org.cowbox1'], env=env, capture_output=True,
                               text=True).stdout
        t.fail(f'cowboxd did not take its bus name:\n{open(self.log).read()}\nthe name is held by:\n{owner[:600]}')

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)
        self.proc.wait(30)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run_daemon_to_exit(store, bus=None):
    """Runs cowboxd, on a bus of its own unless given one, until it exits:
    for a daemon that must refuse to start."""
    own = bus is None
    bus = bus or Bus(store)
    try:
        return subprocess.run([daemon_exe(), '--store', store.path], env=dict(os.environ, **bus.env),
                              capture_output=True, text=True, timeout=60)
    finally:
        if own:
            bus.stop()


@contextlib.contextmanager
def bus_and_daemon(store, policy='contrib', args=(), env=None, cgroup=None):
    bus = Bus(store, policy)
    daemon = Daemon(store, bus, args, env, cgroup)
    try:
        daemon.start()
        yield bus, daemon
    finally:
        daemon.stop()
        bus.stop()


def run(bus, argv, expect=0, user=None, timeout=120, stdin=None):
    """Runs a bus client against the private bus, as root or as user (a
    (uid, gid, groups) tuple)."""
    if user:
        uid, gid, groups = user
        argv = ['setpriv', f'--reuid={uid}', f'--regid={gid}',
                f'--groups={",".join(map(str, groups))}' if groups else '--clear-groups'] + list(argv)
    env = dict(os.environ, **bus.env)
    p = subprocess.run([str(a) for a in argv], env=env, capture_output=True, text=True, timeout=timeout,
                       stdin=stdin)
    r = t.Result([str(a) for a in argv], p.returncode, p.stdout, p.stderr, 0)
    if expect is not None and expect != 'fail' and p.returncode != expect:
        t.fail(f'expected exit status {expect}:\n{r.describe()}')
    if expect == 'fail' and p.returncode == 0:
        t.fail(f'expected a failure:\n{r.describe()}')
    return r


def gdbus_call(bus, method, *args, expect=0, user=None, path='/org/cowbox1', interface='org.cowbox1.Manager'):
    return run(bus, ['gdbus', 'call', '--system', '--dest', 'org.cowbox1', '--object-path', path,
                     '--method', f'{interface}.{method}'] + list(args), expect=expect, user=user)


def gdbus_json(bus, method, *args):
    """Calls a method that returns one JSON string and decodes it."""
    out = gdbus_call(bus, method, *args).out.strip()
    m = re.match(r"^\('(.*)',\)$", out, re.S)
    if not m:
        t.fail(f'{method}: not a string result: {out}')
    return json.loads(m.group(1).encode().decode('unicode_escape'))


def error_name(result):
    m = re.search(r'GDBus\.Error:([\w.]+)', result.err)
    return m.group(1) if m else None


def cowbox(bus, *args, expect=0, user=None, stdin=None):
    return run(bus, [client_exe()] + list(args), expect=expect, user=user, stdin=stdin)


def names(bus):
    return sorted(s['name'] for s in json.loads(cowbox(bus, '--json', 'list').out))


def ensure_group(name):
    """A system group (created if missing)."""
    import grp
    try:
        grp.getgrnam(name)
    except KeyError:
        subprocess.run(['groupadd', '--system', name], check=True, capture_output=True)


def ensure_user(name, groups=()):
    """A real unprivileged user (created if missing): (uid, gid, [gids])."""
    import grp
    import pwd
    for g in groups:
        ensure_group(g)
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(['useradd', '--system', '--no-create-home', '--shell', '/usr/sbin/nologin', name],
                       check=True, capture_output=True)
        pw = pwd.getpwnam(name)
    gids = [grp.getgrnam(g).gr_gid for g in groups]
    return pw.pw_uid, pw.pw_gid, gids


def kill_while_saving(bus, daemon, temp_file, argv):
    """Runs the client with argv and kills the daemon with -9 while the call
    saves a list, then starts it again. The save writes temp_file first: as
    a FIFO, it holds the daemon in open() until it is killed."""
    os.mkfifo(temp_file)
    call = subprocess.Popen([client_exe(), *argv], env=dict(os.environ, **bus.env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for('the daemon held in opening its list', lambda: open(
            f'/proc/{daemon.proc.pid}/syscall').read().split()[0] == '257')
        daemon.kill(signal.SIGKILL)
    finally:
        call.wait(30)
        os.unlink(temp_file)
    daemon.start()


def signals_of(bus, fn):
    """The signals of cowboxd (as dbus-monitor prints them) sent while fn()
    runs."""
    log = os.path.join(bus.dir, 'signals-of')
    with open(log, 'w') as out:
        monitor = subprocess.Popen(['dbus-monitor', '--system', "type='signal',sender='org.cowbox1'"],
                                   env=dict(os.environ, **bus.env), stdout=out, stderr=subprocess.DEVNULL)
    try:
        wait_for('dbus-monitor on the bus', lambda: 'NameAcquired' in open(log).read())
        fn()
        # The reply may come before the signals sent with it.
        time.sleep(0.5)
    finally:
        monitor.terminate()
        monitor.wait()
    return open(log).read()


def wait_for(what, fn, timeout=30):
    """Waits until fn() is true, or fails naming what was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return
        time.sleep(0.2)
    t.fail(f'{what}: not within {timeout}s')
