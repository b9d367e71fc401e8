"""The package's metadata, license and tool settings, and what a
non-editable ``pip install .`` puts on a machine.

``minichain.dist`` is a folder named like build output: pytest
(``norecursedirs``), ruff (its default ``exclude``) and setuptools' automatic
package discovery all skip folders named ``dist`` unless told otherwise.
Each of them is checked here.
"""
import configparser
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The extras users install by name (README.md, Makefile, .ci).
ONEDNN = ("onednn-cpu-gomp==2023.2.0; platform_system == 'Linux' and "
          "platform_machine == 'x86_64'")
EXTRAS = {
    'mpi': ['mpi4py>=3.1', 'mpich'],
    'mpi-system': ['mpi4py>=3.1'],
    'cuda12': ['cupy-cuda12x[ctk]>=14', 'nvidia-nccl-cu12'],
    'cuda13': ['cupy-cuda13x[ctk]>=14', 'nvidia-nccl-cu13'],
    'gpu': ['cupy-cuda12x[ctk]>=14', 'nvidia-nccl-cu12'],
    'onednn': [ONEDNN],
    'cudnn': ['nvidia-cudnn-cu13>=9'],
    'image': ['Pillow'],
    'plot': ['matplotlib'],
    'progress': ['tqdm'],
    'test': ['pytest>=7', 'pytest-timeout', 'mpi4py>=3.1', 'mpich', 'Pillow',
             'matplotlib', 'tqdm', ONEDNN],
    'test-system': ['pytest>=7', 'pytest-timeout', 'mpi4py>=3.1', 'Pillow',
                    'matplotlib', 'tqdm'],
}
PLUGIN = 'minichain.dist.testing.pytest_plugin'
# Our distribution's name. "minichain" on PyPI is somebody else's project
# (0.3.3, a library for language models): our old install line, the bare
# name with the extra mpi in brackets, installed that, so no line of ours
# may say it.
DIST_NAME = 'minichain-autodiff'


def _toml(path):
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip(
            'tomli', reason='reading pyproject.toml needs Python 3.11+ '
            '(tomllib) or tomli')
    with open(path, 'rb') as f:
        return tomllib.load(f)


@pytest.fixture(scope='module')
def pyproject():
    return _toml(ROOT / 'pyproject.toml')


def _setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / 'setup.cfg')
    return cfg


def test_license_file_matches_the_declared_license(pyproject):
    project = pyproject['project']
    assert project['license'] == 'MIT'
    assert project['license-files'] == ['LICENSE']
    text = (ROOT / 'LICENSE').read_text()
    assert text.startswith('MIT License\n\nCopyright (c) 2026 the minichain '
                           'authors\n')
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text


def test_metadata_is_in_pyproject_only(pyproject):
    project = pyproject['project']
    assert project['name'] == DIST_NAME
    assert project['dynamic'] == ['version']
    assert pyproject['tool']['setuptools']['dynamic']['version'] == {
        'attr': 'minichain.__version__'}
    assert project['readme'] == 'README.md'
    assert project['requires-python'] == '>=3.10'
    assert 'numpy>=1.24' in project['dependencies']
    assert 'threadpoolctl>=3.1' in project['dependencies']
    assert 'ml_dtypes>=0.4' in project['dependencies']   # mixed16, CPU
    assert project['optional-dependencies'] == EXTRAS
    assert project['entry-points']['pytest11'] == {PLUGIN: PLUGIN}
    sections = _setup_cfg().sections()
    assert not [s for s in sections if s == 'metadata'
                or s.startswith('options')], sections


def _skips(patterns, names=('dist', 'minichain/dist', 'tests/dist')):
    return [(p, n) for p in patterns for n in names if fnmatch.fnmatch(n, p)]


def test_pytest_recurses_into_dist():
    patterns = _setup_cfg()['tool:pytest']['norecursedirs'].split()
    assert patterns and not _skips(patterns)
    done = subprocess.run([sys.executable, '-m', 'pytest', '--collect-only',
                           '-q', '-p', 'no:cacheprovider', 'tests'], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert 'tests/dist/test_extensions.py::' in done.stdout


def test_linters_do_not_skip_dist(pyproject):
    ruff = pyproject['tool']['ruff']
    # 'exclude' replaces ruff's default list (which holds 'dist');
    # 'extend-exclude' would only add to it.
    assert 'exclude' in ruff and not _skips(ruff['exclude'])
    assert 'extend-exclude' not in ruff
    flake8 = _setup_cfg()['flake8']['exclude'].split(',')
    assert not _skips(flake8)


@pytest.mark.skipif(shutil.which('ruff') is None, reason='ruff is not '
                    'installed (the settings are checked by reading them '
                    'in test_linters_do_not_skip_dist)')
def test_ruff_lints_the_dist_package():
    done = subprocess.run(['ruff', 'check', '--show-files', '.'], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    files = {os.path.relpath(line.strip(), ROOT)
             for line in done.stdout.splitlines() if line.strip()}
    assert 'minichain/dist/optimizers.py' in files, sorted(files)[:20]


# -- a real, non-editable install --------------------------------------------
@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp('wheel')
    # A copy, so that the build leaves nothing in the checkout and nothing
    # left there (build/lib of an earlier build) gets into the wheel.
    source = out / 'source'
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        '.git', '.venv*', 'build', '*.egg-info', '__pycache__', 'result',
        '.pytest_cache', '.slurm'))
    done = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps',
                           '-q', '-w', str(out), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    found = list(out.glob(DIST_NAME.replace('-', '_') + '-*.whl'))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.slow
def test_wheel_holds_every_module_and_the_license(wheel):
    source = {str(p.relative_to(ROOT)) for p in
              (ROOT / 'minichain').rglob('*.py')
              if '__pycache__' not in p.parts}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert source - names == set()
    assert 'minichain/dist/optimizers.py' in names
    assert any(n.endswith('.dist-info/licenses/LICENSE') for n in names)


CHECK = '''
import importlib.metadata as md, os, sys
import minichain, minichain.dist.optimizers
site = os.path.realpath(sys.argv[1])
for module in (minichain, minichain.dist.optimizers):
    assert os.path.realpath(module.__file__).startswith(site), module.__file__
eps = [e.value for e in md.entry_points(group='pytest11')]
assert eps == ['minichain.dist.testing.pytest_plugin'], eps
print('ok')
'''


@pytest.mark.slow
def test_pip_install_into_a_fresh_venv(wheel, tmp_path):
    """``pip install`` (not editable) into a new venv: the package, its
    dist subpackage and the pytest plugin come from site-packages, and
    pytest there loads the plugin (its ``mpi`` marker)."""
    venv = tmp_path / 'venv'
    base = getattr(sys, '_base_executable', sys.executable)
    subprocess.run([base, '-m', 'venv', '--without-pip', str(venv)],
                   check=True, timeout=300)
    python = str(venv / 'bin' / 'python')
    done = subprocess.run([sys.executable, '-m', 'pip', '--python', python,
                           'install', '-q', str(wheel), 'pytest'],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    site = subprocess.run([python, '-c', 'import sysconfig; print('
                           'sysconfig.get_paths()["purelib"])'],
                          capture_output=True, text=True, check=True)
    work = tmp_path / 'elsewhere'  # not the checkout: nothing shadows it
    work.mkdir()
    done = subprocess.run([python, '-c', CHECK, site.stdout.strip()],
                          cwd=work, capture_output=True, text=True,
                          timeout=300)
    assert done.stdout == 'ok\n', done.stdout + done.stderr
    done = subprocess.run([python, '-m', 'pytest', '--markers'], cwd=work,
                          capture_output=True, text=True, timeout=300)
    assert '@pytest.mark.mpi(ranks=' in done.stdout, done.stdout[-2000:]


def _tracked_files():
    listed = subprocess.run(['git', 'ls-files'], cwd=ROOT, text=True,
                            capture_output=True)
    if listed.returncode != 0:
        pytest.skip('not a git checkout: ' + listed.stderr.strip())
    return [ROOT / name for name in listed.stdout.splitlines()]


def test_no_file_installs_minichain_from_pypi_by_its_bare_name():
    # The bare name with an extra, or after pip install, names the other
    # project.
    # Built from pieces so that this file does not match itself.
    bare = re.compile(r'(?<![\w.-])' + 'mini' + r'chain\[[a-z]|pip install '
                      r'(-U |--upgrade )?"?' + 'mini' + r'chain(?![\w.-])')
    hits = []
    for path in _tracked_files():
        if path.suffix in ('.png', '.gz', '.npz') or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors='replace')
                                      .splitlines(), 1):
            if bare.search(line):
                hits.append('{}:{}: {}'.format(
                    path.relative_to(ROOT), number, line.strip()))
    assert not hits, '\n'.join(hits)
