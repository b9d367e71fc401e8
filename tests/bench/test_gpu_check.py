"""bench/gpu_check.sh on the CPU: the stage limits add up to less than
the budget (420 s: the whole run fits a short loan twice), the ResNet-50
stage comes right after the set-up and the device probe, a plan over
budget is refused (--dry-run), and, in the script's dry mode with the
probe's answer taken as "a GPU is here", a library a stage needs that is
missing fails the run; the wheels carried for it are installed without a
registry."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, 'bench', 'gpu_check.sh')
STAGE = re.compile(r'^  (\S+) +(\d+) s  (.+)$')


def _dry_run(script=SCRIPT):
    return subprocess.run(['bash', script, '--dry-run'], capture_output=True,
                          text=True, timeout=60)


def _plan(out):
    stages = [STAGE.match(line).groups() for line in out.splitlines()
              if STAGE.match(line)]
    budget = int(re.search(r'budget (\d+) s;', out).group(1))
    grace = int(re.search(r'may take (\d+) s more', out).group(1))
    overhead = int(re.search(r'(\d+) s between stages', out).group(1))
    total = int(re.search(r'total (\d+) s with kill grace', out).group(1))
    return stages, budget, grace, overhead, total


def test_the_stage_limits_add_up_to_less_than_the_budget():
    res = _dry_run()
    assert res.returncode == 0, res.stdout + res.stderr
    stages, budget, grace, overhead, total = _plan(res.stdout)
    assert total == overhead + sum(int(s) + grace for _, s, _ in stages)
    assert total <= budget, res.stdout
    assert 'within budget' in res.stdout
    # 8 minutes of a 15-minute loan, the machine's start-up aside: a failed
    # first run can be run again
    assert budget <= 420


def test_resnet_comes_right_after_the_probe_and_every_stage_is_planned():
    stages, _, _, _, _ = _plan(_dry_run().stdout)
    names = [n for n, _, _ in stages]
    assert names[:4] == ['setup', 'environment', 'probe', 'resnet'], names
    assert names.index('warm') < min(names.index(n) for n in (
        'nccl', 'nccl2', 'cudnn', 'tests', 'train'))  # the kernel cache
    assert len(set(names)) == len(names)
    with open(SCRIPT) as f:
        text = f.read()
    for name in names:  # every planned stage runs (or is skipped) by name
        assert re.search(r'\b(stage|skip) {}\b'.format(re.escape(name)),
                         text) or name == 'probe', name


def test_a_plan_over_budget_is_refused(tmp_path):
    with open(SCRIPT) as f:
        text = f.read()
    over = tmp_path / 'gpu_check.sh'
    over.write_text(re.sub(r'^BUDGET=\d+', 'BUDGET=300', text, flags=re.M))
    res = _dry_run(str(over))
    assert res.returncode == 2, res.stdout
    assert 'OVER BUDGET by' in res.stderr


def test_keep_going_is_the_default():
    with open(SCRIPT) as f:
        text = f.read()
    assert re.search(r'^KEEP_GOING=1$', text, flags=re.M)
    assert '--stop-on-failure) KEEP_GOING=0' in text


def _planted_mpi4py(tmp_path):
    """An mpi4py whose import fails as one without its MPI library does
    (the device's Python of issue 40), first on the path."""
    pkg = tmp_path / 'planted' / 'mpi4py'
    pkg.mkdir(parents=True)
    (pkg / '__init__.py').write_text(
        'raise ImportError("libmpi.so.12: cannot open shared object file")\n')
    return str(pkg.parent)


def _dry(tmp_path, dry, stages, wheels):
    env = dict(os.environ, GPU_CHECK_DRY=dry, PYTHON=sys.executable,
               GPU_CHECK_WHEELS=str(wheels),
               PYTHONPATH=_planted_mpi4py(tmp_path))
    env.pop('OUT', None)
    return subprocess.run(
        ['bash', SCRIPT, '--stages', stages, '--log',
         str(tmp_path / 'log')], env=env, capture_output=True, text=True,
        timeout=300)


def test_with_a_gpu_a_stage_without_its_library_fails_the_run(tmp_path):
    """mpi4py without an MPI library: the NCCL stages were skipped and the
    run passed, on a GPU machine."""
    res = _dry(tmp_path, 'gpu', 'nccl,nccl2', tmp_path / 'no wheels')
    assert res.returncode == 1, res.stdout + res.stderr
    assert 'no wheels were carried' in res.stdout
    for stage in ('nccl', 'nccl2'):
        assert re.search(r'^  {} +MISSING .*mpi4py is not usable.*libmpi'
                         .format(stage), res.stdout, re.M), res.stdout


def test_without_a_gpu_the_same_stages_are_skipped(tmp_path):
    res = _dry(tmp_path, '1', 'nccl,cudnn', tmp_path / 'no wheels')
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r'^  nccl +skipped .*mpi4py', res.stdout, re.M)


def test_a_missing_cudnn_fails_the_run_with_a_gpu(tmp_path):
    from minichain.kernels import cudnn
    if not cudnn.problem():
        pytest.skip('cuDNN is here: ' + cudnn.describe())
    res = _dry(tmp_path, 'gpu', 'cudnn', tmp_path / 'no wheels')
    assert res.returncode == 1, res.stdout + res.stderr
    assert re.search(r'^  cudnn +MISSING .*cuDNN 9 was not found',
                     res.stdout, re.M), res.stdout
    assert re.search(r'^cuDNN +cuDNN not used', res.stdout, re.M)


def test_the_carried_wheels_bring_mpi_without_a_registry(tmp_path):
    """bench/gpu_wheels.sh's wheels (here only this Python's), installed by
    the setup stage with --no-index over a broken mpi4py; the NCCL stage
    then runs (its tests skip what needs a GPU)."""
    wheels = tmp_path / 'wheels'
    got = subprocess.run(
        [sys.executable, '-m', 'pip', 'download', '-q', '--no-deps',
         '--only-binary=:all:', '-d', str(wheels), 'mpich', 'mpi4py'],
        capture_output=True, text=True, timeout=240)
    if got.returncode:
        pytest.skip('no wheels to carry (pip download: {})'.format(
            got.stderr.strip().splitlines()[-1:]))
    res = _dry(tmp_path, 'gpu', 'nccl', wheels)
    assert 'setup: installed mpi4py and MPICH from' in res.stdout, res.stdout
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r'^  nccl +passed', res.stdout, re.M), res.stdout
