#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The build-farm job: the project's own source tree, copied into a
subvolume and snapshotted, builds with meson and ninja inside the mounted
snapshot; the program built there works (it makes a store of its own), a
second ninja run has nothing to do (times are stable), and the origin is
untouched by the build."""

import os
import shutil
import stat
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402

EXCLUDED_TOP = {'.git', 'demo-store'}


def source_files(root):
    """The project's files: from git if this is a checkout (tracked and new
    files), else everything but build directories."""
    if shutil.which('git') and os.path.exists(os.path.join(root, '.git')):
        r = subprocess.run(['git', '-C', root, 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
                           capture_output=True)
        if r.returncode == 0:
            files = [f.decode() for f in r.stdout.split(b'\0') if f]
            return [f for f in files if os.path.lexists(os.path.join(root, f))]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == '.':
            dirnames[:] = [d for d in dirnames if d not in EXCLUDED_TOP and not d.startswith('build')]
        dirnames[:] = [d for d in dirnames if d != '__pycache__']
        for f in filenames:
            out.append(os.path.normpath(os.path.join(rel, f)))
    return out


def copy_files(src_root, files, dst_root):
    for rel in files:
        src, dst = os.path.join(src_root, rel), os.path.join(dst_root, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def find_tool(build_dir):
    path = os.path.join(build_dir, 'cli', 'cowbox-store')
    if os.access(path, os.X_OK):
        return path
    for dirpath, _, filenames in os.walk(build_dir):
        if 'cowbox-store' in filenames:
            return os.path.join(dirpath, 'cowbox-store')
    t.fail(f'no cowbox-store built in {build_dir}')


def run():
    t.require_fuse()
    for program in ('meson', 'ninja', 'cc', 'pkg-config'):
        t.require_program(program)
    root = t.source_root()
    files = source_files(root)
    t.check('meson.build' in files, f'no meson.build among the {len(files)} source files of {root}')
    print(f'{len(files)} source files', flush=True)
    with t.Store('build-self') as store:
        store.create('src')
        with store.mount('src') as m:
            copy_files(root, files, m.p('cowbox'))
            origin = t.manifest(m.path)
        store.snapshot('src', 'build')
        with store.mount('build') as m:
            src = m.p('cowbox')
            build = os.path.join(src, '_build')
            env = {'CCACHE_DISABLE': '1'}
            r = t.run_command(['meson', 'setup', build], cwd=src, env=env, timeout=600, expect=None)
            t.check(r.code == 0, f'meson setup in the mounted snapshot failed:\n{r.describe()}')
            r = t.run_command(['ninja', '-C', build], env=env, timeout=1200, expect=None)
            t.check(r.code == 0, f'ninja in the mounted snapshot failed:\n{r.describe()}')
            print(f'built in {r.seconds:.1f}s', flush=True)
            r = t.run_command(['ninja', '-C', build, '-n', '-d', 'explain'], timeout=300)
            t.check('no work to do' in r.out, f'a second ninja run would rebuild:\n{r.describe()}')

            r = t.run_command(['meson', 'test', '-C', build, '--suite', 'unit', '--print-errorlogs'],
                              env=env, timeout=600, expect=None)
            t.check(r.code == 0, f'the unit tests built in the mounted snapshot failed:\n{r.describe()}')

            tool = find_tool(build)
            t.check(os.stat(tool).st_mode & stat.S_IXUSR, f'{tool} is not executable')
            r = t.run_command([tool, '--version'])
            t.check(t.project_version() in r.out, f'--version of the built tool:\n{r.describe()}')
            own = os.path.join(store.tmp, 'own-store')
            t.run_command([tool, '--store', own, 'init'])
            t.run_command([tool, '--store', own, 'subvolume', 'create', 'made-by-the-self-built-tool'])
            r = t.run_command([tool, '--store', own, '--json', 'subvolume', 'list'])
            names = [s['name'] for s in t.json_subvolume_list(r.json())]
            t.check_equal(names, ['made-by-the-self-built-tool'], 'subvolumes of a store the built tool made')
        with store.mount('src', readonly=True) as m:
            t.assert_manifests_equal(origin, t.manifest(m.path), 'the origin after a build in its snapshot',
                                     label_a='before', label_b='after')


t.main(run)
