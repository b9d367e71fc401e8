"""One marked test run as an MPI job, seen from both ends.

The outer end, :func:`run` in the plain pytest process, starts
``mpiexec -n k python -m pytest <that test>`` with ``MINICHAIN_PYTEST_JOB``
naming a fresh folder, waits at most the test's timeout, and makes the
item's reports from what the ranks left in that folder. The inner end,
:class:`Rank` (the plugin inside each rank), runs the test in place and
rewrites ``rank<r>.json`` (atomically) after each phase: its pid and host,
the phase records, whether its session finished. It also dumps its Python
stacks into ``rank<r>.stack`` on ``SIGUSR1``, which is how the report shows
where a rank that did not finish was. Nothing is read from the launcher's
output, so any MPI's launcher works (the ranks must see the folder: one
machine, or a shared ``TMPDIR``).
"""
import contextlib
import faulthandler
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import pytest

from minichain.dist.testing import reports
from minichain.dist import shm_files
from minichain.dist import launcher

ENV_JOB = 'MINICHAIN_PYTEST_JOB'
ENV_STALL = 'MINICHAIN_STALL_TIMEOUT'
_THREAD_VARIABLES = ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS',
                     'MKL_NUM_THREADS')
_PLUGIN = 'minichain.dist.testing.pytest_plugin'
_TAIL_LINES = 40


def have_mpi4py():
    """Whether mpi4py is importable (without importing it)."""
    return importlib.util.find_spec('mpi4py') is not None


def mpi_world():
    """``(rank, size)`` of ``MPI.COMM_WORLD`` (this starts MPI)."""
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def abort_job():
    """End the whole MPI job at once, if this process runs MPI."""
    MPI = sys.modules.get('mpi4py.MPI')
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        sys.stdout.flush()
        sys.stderr.flush()
        shm_files.before_abort()  # what MPI_Abort skips
        MPI.COMM_WORLD.Abort(1)
        os._exit(1)  # MPICH returns when another rank's abort ends the job


def _save_json(path, obj):
    tmp = '{}.{}.tmp'.format(path, os.getpid())
    with open(tmp, 'w') as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _rank_file(job, rank):
    return os.path.join(job, 'rank{}.json'.format(rank))


def _signal_local(states, sig):
    """Send ``sig`` to the ranks of ``states`` that run on this host."""
    host = socket.gethostname()
    for state in states:
        if state and state.get('host') == host:
            with contextlib.suppress(OSError):
                os.kill(state['pid'], sig)


# -- inside each rank ----------------------------------------------------------
class Rank:
    """This process is rank ``rank`` of a job the plugin launched."""

    def __init__(self, job, world):
        spec = _load_json(os.path.join(job, 'job.json'))
        self.job, self.nodeid, self.grace = job, spec['nodeid'], spec['grace']
        self.rank, self.size = world
        self.basetemp = os.path.join(job, 'rank{}'.format(self.rank))
        self.state = {'rank': self.rank, 'size': self.size,
                      'pid': os.getpid(), 'host': socket.gethostname(),
                      'selected': None, 'records': [], 'finished': False,
                      'gave_up': None}
        if hasattr(signal, 'SIGUSR1'):
            self._stacks = open(os.path.join(
                job, 'rank{}.stack'.format(self.rank)), 'w')
            faulthandler.register(signal.SIGUSR1, file=self._stacks,
                                  all_threads=True)
        self._save()

    def _save(self):
        _save_json(_rank_file(self.job, self.rank), self.state)

    def select(self, config, items):
        """Keep only the item the job is for (and say if it is missing)."""
        chosen = [i for i in items if i.nodeid == self.nodeid]
        others = [i for i in items if i.nodeid != self.nodeid]
        self.state['selected'] = [i.nodeid for i in chosen]
        if not chosen:
            self.state['records'].append(reports.failure('collect', (
                'the relaunched pytest did not find {}; it collected: {}'
                .format(self.nodeid, ', '.join(i.nodeid for i in items[:20])
                        or 'nothing'))))
        if others:
            config.hook.pytest_deselected(items=others)
            items[:] = chosen
        self._save()

    def add(self, record):
        """Keep a phase's record; after a failure, give the other ranks
        ``grace`` seconds to finish that phase, then end the job."""
        self.state['records'].append(record)
        self._save()
        if record['outcome'] != 'passed':
            self._wait_for_others(record['when'])

    def finish(self, exitstatus):
        self.state['finished'] = True
        self.state['exitstatus'] = exitstatus
        self._save()

    def _wait_for_others(self, when):
        later = reports.PHASES[reports.PHASES.index(when):]

        def late():
            out = []
            for rank in range(self.size):
                s = _load_json(_rank_file(self.job, rank))
                if rank != self.rank and not (s and (s['finished'] or any(
                        r['when'] in later for r in s['records']))):
                    out.append((rank, s))
            return out
        end = time.monotonic() + self.grace
        while late() and time.monotonic() < end:
            time.sleep(0.02)
        missing = late()
        if missing and sys.modules.get('mpi4py.MPI') is not None:
            self.state['gave_up'] = {'ranks': [r for r, _ in missing],
                                     'grace': self.grace}
            self._save()
            _signal_local([s for _, s in missing], getattr(
                signal, 'SIGUSR1', signal.SIGTERM))
            time.sleep(0.5)  # the stacks are written by then
            abort_job()


# -- in the plain pytest process -----------------------------------------------
def run(item, k, spec):
    """Run ``item`` under ``mpiexec -n k``; returns its TestReports (a
    failure of the plugin itself fails the item, not the session)."""
    start = time.monotonic()
    try:
        return _run(item, k, spec, start)
    except Exception:
        return _reports(item, reports.Result(
            'failed', 'setup', '{}: {} failed:\n{}'.format(
                item.nodeid, _PLUGIN, traceback.format_exc()), [], None),
            time.monotonic() - start)


def _run(item, k, spec, start):
    launched = 'mpiexec -n {}'.format(k)
    try:
        cmd = launcher.mpiexec_command(k)
    except launcher.LauncherNotFound as e:
        text = '{}: cannot run it under {}: {}'.format(
            item.nodeid, launched, e)
        return _reports(item, reports.Result('failed', 'call', text, [],
                                             None), 0.0)
    job = tempfile.mkdtemp(prefix='minichain-mpi-')
    _save_json(os.path.join(job, 'job.json'),
               {'nodeid': item.nodeid, 'ranks': k, 'grace': spec.grace})
    target = '{}::{}'.format(item.path, item.nodeid.split('::', 1)[1])
    cmd += [sys.executable, '-m', 'pytest', target] + _pytest_args(
        item.config, job)
    env = _environment(spec, k, job)
    for _ in range(3):
        for rank in range(k):
            if os.path.exists(_rank_file(job, rank)):
                os.remove(_rank_file(job, rank))
        try:
            rc, timed_out = _run_job(cmd, env, str(
                item.config.invocation_params.dir), spec.timeout, job, k)
        except OSError as e:
            shutil.rmtree(job, ignore_errors=True)
            return _reports(item, reports.Result(
                'failed', 'call', '{}: could not start {!r}: {}\n{}'.format(
                    item.nodeid, cmd[0], e, launcher.INSTALL_HINT), [], None),
                time.monotonic() - start)
        states = [_load_json(_rank_file(job, r)) for r in range(k)]
        # Hydra (MPICH's launcher) may exit 1 at once, without a word,
        # before any rank started; only that case is retried.
        if rc == 0 or timed_out or any(states) or _tail(job).strip() or \
                time.monotonic() - start > 5:
            break
    result = _result(states, rc, timed_out, spec, launched, job)
    if result.outcome == 'failed':
        result = result._replace(longrepr='{}\n\n(the job\'s files, its '
                                 'output included: {})'.format(
                                     result.longrepr, job))
    else:
        shutil.rmtree(job, ignore_errors=True)
    return _reports(item, result, time.monotonic() - start)


def _pytest_args(config, job):
    option = config.option
    args = ['-p', _PLUGIN, '-q', '--rootdir', str(config.rootpath)]
    if config.inipath:
        args += ['-c', str(config.inipath)]
    for plugin in option.plugins or ():
        args += ['-p', plugin]
    if option.importmode != 'prepend':
        args += ['--import-mode', option.importmode]
    if option.confcutdir:
        args += ['--confcutdir', str(option.confcutdir)]
    if option.noconftest:
        args.append('--noconftest')
    for warning in option.pythonwarnings or ():
        args += ['-W', warning]
    if config.pluginmanager.hasplugin('xdist'):
        args += ['-n', '0']  # one test, in this rank
    for ini in option.override_ini or ():
        args += ['-o', ini]
    if getattr(option, 'with_mpi', False):
        # pytest-mpi's switch: without it there, pytest-mpi skips the test
        # in the ranks (its rule for every mpi mark, ours included).
        args.append('--with-mpi')
    return args + ['-o', 'cache_dir=' + os.path.join(job, 'cache')]


def _environment(spec, k, job):
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    env[ENV_JOB] = job
    # The stall watchdog reports a stuck collective before the timeout.
    env.setdefault(ENV_STALL, '{:g}'.format(
        max(1.0, spec.timeout - min(30.0, 0.2 * spec.timeout))))
    cores = len(os.sched_getaffinity(0)) if hasattr(
        os, 'sched_getaffinity') else (os.cpu_count() or 1)
    for name in _THREAD_VARIABLES:
        env.setdefault(name, str(max(1, cores // k)))
    # The ranks import this plugin before pytest adds any rootdir to the
    # path: make sure this minichain is found.
    here = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    env['PYTHONPATH'] = os.pathsep.join(
        [p for p in (env.get('PYTHONPATH'), here) if p])
    return env


def _run_job(cmd, env, cwd, timeout, job, k):
    with open(os.path.join(job, 'output.txt'), 'wb') as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=cwd, start_new_session=True)
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            pass
        except BaseException:  # Ctrl-C: the job must not outlive pytest
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        states = [_load_json(_rank_file(job, r)) for r in range(k)]
        unfinished = [s for s in states if s and not s['finished']]
        if hasattr(signal, 'SIGUSR1'):
            _signal_local(unfinished, signal.SIGUSR1)
            time.sleep(0.5)  # the stacks are written by then
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, None)):
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                pass
        # Open MPI puts each rank in a process group of its own.
        _signal_local(unfinished, signal.SIGKILL)
        proc.wait()
        return proc.returncode, True


def _tail(job):
    try:
        with open(os.path.join(job, 'output.txt'), 'rb') as f:
            text = f.read().decode(errors='replace')
    except OSError:
        return ''
    return '\n'.join(text.splitlines()[-_TAIL_LINES:])[-6000:]


def _stacks(path):
    """The faulthandler dump at ``path``, each thread cut where pytest's
    own frames start, thread ids dropped (so equal stacks compare equal)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return ''
    out, inside = [], False
    for line in lines:
        if not line.startswith(' '):  # "Current thread 0x... (most ...):"
            out.append(re.sub(r' 0x[0-9a-f]+', '', line))
            inside = False
        elif not inside and re.search(r'[/\\](_pytest|pluggy)[/\\]', line):
            out.append('  ... (pytest)')
            inside = True
        elif not inside:
            out.append(line)
    return '\n'.join(out).strip()


def _where(state):
    if not state['records']:
        return 'while collecting' if state['selected'] is None else \
            'in setup'
    last = state['records'][-1]['when']
    return {'collect': 'while collecting', 'setup': 'in the test body',
            'call': 'in teardown'}.get(last, 'after teardown')


def _result(states, rc, timed_out, spec, launched, job):
    records, unfinished = {}, {}
    gave_up = [(r, s['gave_up']) for r, s in enumerate(states)
               if s and s.get('gave_up')]
    for rank, state in enumerate(states):
        if state is None:
            unfinished[rank] = ('it left no report (it did not get as far '
                                'as pytest\'s configuration)')
            continue
        if state['finished'] or any(r['when'] == 'teardown' or r['outcome']
                                    == 'failed' for r in state['records']):
            records[rank] = state['records']  # a failure tells its story
            continue
        if timed_out:
            why = ('it was still running {} when the timeout of {:g} s '
                   '(mpi(timeout=...)) ended the job'.format(
                       _where(state), spec.timeout))
        elif any(rank in g['ranks'] for _, g in gave_up):
            failed = [r for r, g in gave_up if rank in g['ranks']]
            why = ('it was still running {} {:g} s after rank {} failed, '
                   'which then ended the job (it was most likely waiting for '
                   'that rank in a collective)'.format(
                       _where(state), gave_up[0][1]['grace'], failed[0]))
        else:
            why = 'the job ended (exit code {}) while it was {}'.format(
                rc, _where(state))
        stacks = _stacks(os.path.join(job, 'rank{}.stack'.format(rank)))
        unfinished[rank] = why + (
            ', here (Python stacks, innermost first):\n' + stacks
            if stacks else '')
    result = reports.combine(records, len(states), unfinished, launched)
    if result.outcome != 'failed' and rc != 0:
        return reports.Result('failed', 'teardown', '{}: every rank finished '
                              '({}), but the job exited with code {}; its '
                              'output ends:\n{}'.format(
                                  launched, result.outcome, rc, _tail(job)),
                              [], None)
    if result.outcome == 'failed' and not any(states):
        result = result._replace(longrepr='{}\n\nThe job\'s output ends:\n{}'
                                 .format(result.longrepr, _tail(job)))
    return result


def _reports(item, result, duration):
    """The setup, call and teardown reports of ``item`` for ``result``."""
    when = 'setup' if result.when == 'collect' else result.when
    if result.outcome == 'passed':
        when = 'call'
    phases = ['setup'] if when == 'setup' else ['setup', 'call']
    out = []
    for phase in phases + ['teardown']:
        mine = phase == when
        rep = pytest.TestReport(
            item.nodeid, item.location, {k: 1 for k in item.keywords},
            result.outcome if mine else 'passed',
            result.longrepr if mine else None, phase,
            result.sections if mine else (), duration if mine else 0.0,
            user_properties=item.user_properties)
        if mine and result.wasxfail is not None:
            rep.wasxfail = result.wasxfail
        out.append(rep)
    return out
