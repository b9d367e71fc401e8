"""models/train_resnet50.sbatch under a real Slurm (``make test-slurm``).

``make test-slurm`` starts a one-node cluster on this machine
(.ci/slurm-cluster: munged, slurmctld and slurmd) and runs this file with
``SLURM_CONF`` pointing at it: ``sbatch`` of the job script with 2 tasks,
a pre-emption by ``scancel --signal=TERM`` and a resubmission that resumes.
Without a cluster the tests skip, saying so.
"""
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.models._snapshots import assert_same_model, snapshots
from tests.models.test_train_resnet50 import SYNTHETIC

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
JOB = os.path.join(ROOT, 'models', 'train_resnet50.sbatch')


def test_readme_shows_the_job_script():
    with open(JOB) as f:
        script = f.read()
    with open(os.path.join(ROOT, 'models', 'README.md')) as f:
        readme = f.read()
    assert script in readme, 'models/README.md must show {} as it is'.format(
        JOB)


def _slurm(*args, timeout=60):
    proc = subprocess.run(list(args), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, '{}: {}{}'.format(' '.join(args),
                                                   proc.stdout, proc.stderr)
    return proc.stdout


@pytest.fixture(scope='module')
def cluster():
    if not os.environ.get('SLURM_CONF') or not shutil.which('sbatch'):
        pytest.skip('no Slurm cluster (make test-slurm starts one)')
    _slurm('sinfo')


def submit(out, log, *args):
    """sbatch the job script with 2 tasks; returns the job id."""
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable,
               OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1', MPLBACKEND='Agg')
    proc = subprocess.run(['sbatch', '--parsable', '--ntasks=2',
                           '--output={}'.format(log), JOB]
                          + [str(a) for a in args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().split(';')[0]


def job(job_id):
    """{'JobState': ..., 'ExitCode': ...} of a job Slurm still knows."""
    text = _slurm('scontrol', 'show', 'job', job_id)
    return dict(re.findall(r'(\w+)=(\S+)', text))


def wait(job_id, log, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = job(job_id)
        if info['JobState'] not in ('PENDING', 'RUNNING', 'CONFIGURING',
                                    'COMPLETING'):
            return info
        time.sleep(0.5)
    subprocess.run(['scancel', job_id], timeout=60)
    pytest.fail('job {} still running after {} s:\n{}'.format(
        job_id, timeout, open(log).read()))


def test_scancel_signal_term_then_resubmit_resumes_exactly(cluster,
                                                           tmp_path):
    full, part = tmp_path / 'full', tmp_path / 'part'
    info = wait(submit(full, tmp_path / 'full.out', *SYNTHETIC),
                tmp_path / 'full.out')
    assert info['ExitCode'] == '0:0', (tmp_path / 'full.out').read_text()

    job_id = submit(part, tmp_path / 'part.out', *SYNTHETIC)
    deadline = time.monotonic() + 300
    while not snapshots(part) and time.monotonic() < deadline:
        time.sleep(0.05)
    _slurm('scancel', '--signal=TERM', job_id)
    info = wait(job_id, tmp_path / 'part.out')
    out = (tmp_path / 'part.out').read_text()
    assert info['ExitCode'] == '143:0', out  # srun passes 128 + 15 on
    stopped = re.search(r'stopped by SIGTERM at iteration (\d+)', out)
    assert stopped, out
    assert max(snapshots(part)) == int(stopped.group(1)) < 24

    info = wait(submit(part, tmp_path / 'again.out', *SYNTHETIC),
                tmp_path / 'again.out')
    again = (tmp_path / 'again.out').read_text()
    assert info['ExitCode'] == '0:0', again
    assert 'done: 24 iterations' in again, again
    assert_same_model(full / 'snapshot_iter_24', part / 'snapshot_iter_24',
                      at_least=50)
