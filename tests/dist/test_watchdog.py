"""No rank waits forever: every way of leaving the others waiting ends the
job, within a bound, with a message that names the ranks (workers/hang.py
under real ``mpiexec -n 2``).

The jobs of the module start together (launching is the slow part) and
each test reads its own; timings are upper bounds with a wide margin for a
loaded machine.
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from minichain.dist import launcher
from minichain.dist.guards import watchdog
from minichain.training.triggers.stop_on_signal import REPEAT_WINDOW
from tests.dist._launch import WORKERS, launcher_crashed, require_mpi

# case -> (MINICHAIN_STALL_TIMEOUT, words the output must hold)
LEFT = 'will never join collective'
CASES = {
    'control': ('3', ()),
    'return': ('60', ('rank 1: left (its program ended', LEFT, 'rank 0 has '
                      'waited', 'in allreduce #2')),
    'exit': ('60', ('rank 1: left (its program ended', LEFT)),
    'uneven': ('60', ('rank 0 has waited', 'in multi_node_mean_grad #3',
                      'rank 1: left', 'after collective #4 '
                      '(multi_node_mean_grad #2)', LEFT, 'dist.join')),
    # the same with overlapped buckets (their own communicator): one rank
    # leaving is named at once; a rank that skips an update waits in the
    # buckets while the other waits on the main communicator, in a
    # collective the first has not begun: each reads the other's note on
    # the sibling communicator and names the cross wait within seconds
    'uneven-overlap': ('60', ('rank 0 has waited', 'in multi_node_mean_grad '
                              '#3', 'flat buckets communicator',
                              'rank 1: left', LEFT, 'dist.join')),
    'caught-overlap': ('60', ('in multi_node_mean_grad #2', 'in '
                              'allreduce_obj #1', 'ranks 0 and 1 wait for '
                              'each other', 'flat buckets communicator',
                              'which rank ')),
    'kinds': ('60', ('CollectiveMismatchError', 'rank 0: allreduce #2',
                     'rank 1: bcast #1')),
    'caught': ('60', ('CollectiveMismatchError', 'rank 0: multi_node_mean_grad'
                      ' #2', 'rank 1: allreduce_obj #1', 'skip an update')),
    'mnbn': ('60', ('CollectiveMismatchError', 'rank 0: multi_node_batch_'
                    'normalization #2', 'rank 1: multi_node_mean_grad #1',
                    'training mode only')),
    'deadlock': ('60', ('to receive from rank 1', 'in allreduce #2',
                        'ranks 0 and 1 wait for each other')),
    'silent': ('4', ('rank 0 has waited', 'rank 1: no word from it',
                     'joined collective #1', 'the stall timeout')),
    'stopped': ('4', ('rank 1: no word from it', 'the stall timeout')),
    # a rank that leaves inside the shared-memory sum, after the header:
    # the others wait in its barrier until the stall timeout
    'shared-exit': ('4', ('rank 0 has waited', 'in multi_node_mean_grad #1',
                          'rank 1: left (its program ended',
                          'the stall timeout')),
    # a NCCL collective that never completes (a fake event; no GPU needed)
    'nccl': ('4', ('rank 0 has waited', 'to wait for the previous NCCL '
                   'averaging, in multi_node_mean_grad #1', 'pure_nccl '
                   'communicator', 'rank 1: no word from it',
                   '[rank 0] fake NCCL communicator aborted',
                   'aborted the NCCL communicator on rank 0',
                   'the stall timeout')),
}
BOUND = 90  # seconds: every case but the timeouts ends in a few


def _launch(case, timeout):
    env = dict(os.environ, OMP_NUM_THREADS='1', OPENBLAS_NUM_THREADS='1',
               PYTHONUNBUFFERED='1', MINICHAIN_STALL_TIMEOUT=timeout)
    env.pop('MINICHAIN_NO_ABORT', None)
    cmd = launcher.mpiexec_command(2) + [
        sys.executable, os.path.join(WORKERS, 'hang.py'), case]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def _finish(proc, start):
    try:
        out, _ = proc.communicate(timeout=max(1, start + BOUND + 60
                                              - time.monotonic()))
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        hung = True
    return proc.returncode, out.decode(errors='replace'), \
        time.monotonic() - start, hung


@pytest.fixture(scope='module')
def jobs():
    require_mpi()
    start = time.monotonic()
    procs = {case: _launch(case, t) for case, (t, _) in CASES.items()}
    results = {case: _finish(p, start) for case, p in procs.items()}
    for case, (rc, out, _, _) in list(results.items()):
        for _ in range(2):  # mpirun's own teardown crash: run it again
            if not launcher_crashed(rc, out):
                break
            again = time.monotonic()
            rc, out, elapsed, hung = _finish(
                _launch(case, CASES[case][0]), again)
            results[case] = (rc, out, elapsed, hung)
    return results


@pytest.mark.mpi
@pytest.mark.parametrize('case', sorted(CASES))
def test_every_stall_ends_the_job_naming_the_ranks(jobs, case):
    rc, out, elapsed, hung = jobs[case]
    assert not hung, out
    if case == 'control':  # the same collectives everywhere: no verdict
        assert rc == 0, out
        assert 'watchdog' not in out and out.count('done') == 2, out
        return
    assert rc != 0, out
    assert '[rank 0] done' not in out, out
    assert elapsed < BOUND, (elapsed, out)
    for words in CASES[case][1]:
        assert words in out, (words, out)
    if 'watchdog:' in out:
        assert 'ending the job with exit status 70' in out, out
        assert rc == watchdog.EXIT_STATUS, out
        report = [line for line in out.splitlines() if 'watchdog:' in line]
        assert all(re.search(r'\[rank \d\] minichain.dist watchdog: ', line)
                   for line in report), report


@pytest.mark.mpi
def test_timeout_cases_wait_for_the_timeout(jobs):
    for case in ('silent', 'stopped', 'nccl'):
        assert jobs[case][2] >= 4, jobs[case]


@pytest.mark.mpi
def test_sigterm_while_blocked_is_noted_and_a_second_one_ends_it():
    # Rank 1 is stopped (SIGSTOP) and rank 0 waits for it in an allreduce:
    # the first SIGTERM is noted at once (the training script would stop at
    # the next iteration), the second ends the job.
    require_mpi()
    proc = _launch('sigterm', '120')
    start = time.monotonic()
    pid = None
    for line in proc.stdout:  # the ranks' lines may run into each other
        found = re.search(rb'\[rank 0\] pid (\d+)', line)
        if found:
            pid = int(found.group(1))
            break
    assert pid is not None
    time.sleep(1.0)  # rank 0 is in its allreduce by now
    os.kill(pid, signal.SIGTERM)
    for line in proc.stdout:
        if b'[rank 0] noted' in line:
            break
    assert b'[rank 0] noted signal 15' in line, line
    # past the window in which a repeat counts as the same request
    time.sleep(REPEAT_WINDOW + 0.5)
    assert proc.poll() is None  # still waiting, not dead
    os.kill(pid, signal.SIGTERM)
    rc, out, elapsed, hung = _finish(proc, start)
    assert not hung and rc != 0, out
    assert elapsed < BOUND, elapsed


def _python(code, env):
    return subprocess.Popen([sys.executable, '-c', code], env=dict(
        os.environ, **env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)


STALLED = '''
import sys, time
from minichain import dist
from minichain.training.triggers import catch_stop_signals
catch_stop_signals()
comm = dist.create_communicator('flat')
comm.allreduce_obj(1)
print('ready', flush=True)
while True:  # stuck outside the collectives (a data loader, say)
    time.sleep(0.05)
'''


@pytest.mark.mpi
@pytest.mark.parametrize('timeout, dies', [('1', True), ('600', False)])
def test_first_sigterm_after_the_stall_timeout_ends_at_once(timeout, dies,
                                                           tmp_path):
    pytest.importorskip('mpi4py')
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    # TMPDIR: where Open MPI's singleton puts its session folder, which a
    # process killed by a signal leaves behind (/tmp/ompi.*): in tmp_path.
    proc = _python(STALLED, {'MINICHAIN_STALL_TIMEOUT': timeout,
                             'PYTHONPATH': root, 'TMPDIR': str(tmp_path)})
    try:
        assert proc.stdout.readline().strip() == 'ready'
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        try:  # ends at once, or (noted only) still runs seconds later
            rc = proc.wait(timeout=30 if dies else 3)
        except subprocess.TimeoutExpired:
            rc = None
        if dies:
            assert rc == -signal.SIGTERM
        else:
            assert rc is None  # noted only: the next iteration would stop
    finally:
        proc.kill()
        proc.wait()


def test_timeout_from_env(monkeypatch):
    monkeypatch.delenv(watchdog.ENV, raising=False)
    assert watchdog.timeout_from_env() == 600
    monkeypatch.setenv(watchdog.ENV, '2.5')
    assert watchdog.timeout_from_env() == 2.5
    monkeypatch.setenv(watchdog.ENV, '0')
    assert watchdog.timeout_from_env() == 0
    for bad in ('-1', 'soon', 'nan', 'inf'):
        monkeypatch.setenv(watchdog.ENV, bad)
        with pytest.raises(ValueError, match=watchdog.ENV):
            watchdog.timeout_from_env()


def test_stall_warning_interval_from_env(monkeypatch):
    monkeypatch.delenv(watchdog.ENV_WARN, raising=False)
    assert watchdog.timeout_from_env(watchdog.ENV_WARN,
                                     watchdog.DEFAULT_WARN) == 60
    monkeypatch.setenv(watchdog.ENV_WARN, 'x')
    with pytest.raises(ValueError, match='MINICHAIN_STALL_WARN=.x.: '
                       'expected a number of seconds >= 0 .0 turns it off'):
        watchdog.timeout_from_env(watchdog.ENV_WARN, watchdog.DEFAULT_WARN)


@pytest.mark.mpi
def test_a_slow_rank_is_named_in_a_warning_at_each_interval():
    # Silent until the stall timeout (600 s) before: a rank merely slow or
    # stuck outside a collective gave no sign for ten minutes.
    from tests.dist._launch import run_mpi
    res = run_mpi(2, 'hang.py', 'slow', timeout=60, env={
        'MINICHAIN_STALL_WARN': '1', 'MINICHAIN_STALL_TIMEOUT': '60'})
    assert res.returncode == 0 and res.output.count('done') == 2, res.output
    warnings = [line for line in res.output.splitlines() if 'warning' in line]
    assert 2 <= len(warnings) <= 4, res.output  # at 1, 2 and 3 s
    for n, line in enumerate(warnings, 1):
        assert line.startswith(
            '[rank 0] minichain.dist watchdog: warning: rank 0 has waited '
            '{} s in allreduce #2 (collective #2 of the flat communicator), '
            'for rank 1: no word from it: it joined collective #1 with the '
            'others'.format(n)), line
        assert line.endswith('the job ends after 60 s (MINICHAIN_STALL_'
                             'TIMEOUT; MINICHAIN_STALL_WARN=1 s between '
                             'warnings)'), line


@pytest.mark.mpi
@pytest.mark.parametrize('n', [2, 3])
def test_a_rank_that_returns_from_main_is_heard_by_the_others(n):
    # The communicator is a local of main() (sys.exit(main())): it is gone
    # before the exit hook runs, and the hook used to find no wire to send
    # the exit note on. The stall timeout is long, so that a lost note shows
    # as this test's own timeout, not as a slower pass.
    from tests.dist._launch import run_mpi
    res = run_mpi(n, 'leave_main.py', timeout=BOUND,
                  env={'MINICHAIN_STALL_TIMEOUT': '600'})
    assert not res.timed_out, res.output
    assert res.returncode == watchdog.EXIT_STATUS, res.output
    for words in ('rank 1: left (its program ended: a return or sys.exit) '
                  'after collective #1 (allreduce #1)',
                  'rank 1 will never join collective #2'):
        assert words in res.output, (words, res.output)
    assert 'rank 1: no word from it' not in res.output, res.output
    assert 'done' not in res.output, res.output
