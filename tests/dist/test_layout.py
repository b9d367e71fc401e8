"""minichain/dist's layer folders, and the old flat paths kept as aliases."""
import importlib
import subprocess
import sys

import pytest

from minichain.dist import _moved


@pytest.mark.parametrize('old', sorted(_moved.OLD_TO_NEW))
def test_an_old_path_is_the_same_module_object(old):
    # One copy of the module's state (the watchdog's thread, the timeline's
    # spans): the alias must not import the file a second time.
    new = importlib.import_module('minichain.dist.' + _moved.OLD_TO_NEW[old])
    assert importlib.import_module('minichain.dist.' + old) is new


def test_python_dash_m_runs_a_moved_module_by_its_old_name():
    out = subprocess.run(
        [sys.executable, '-m', 'minichain.dist.timeline_plot', '--help'],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 'usage: timeline_plot.py' in out.stdout


def test_an_unknown_dist_module_still_fails_to_import():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module('minichain.dist.no_such_module')


def test_the_top_of_dist_holds_the_protocol_and_the_public_api_only():
    # The tree says what a student may skip: guards, tracing, transports,
    # averaging variants and testing each live in a folder of their own.
    import os
    import minichain.dist as d
    here = os.path.dirname(d.__file__)
    top = sorted(f[:-3] for f in os.listdir(here) if f.endswith('.py'))
    assert top == sorted([
        '__init__', '_moved', 'batch_normalization', 'communicator_base',
        'datasets', 'evaluation', 'extensions', 'flat', 'hierarchical',
        'launcher', 'links', 'naive', 'optimizers', 'pure_nccl', 'ring']), top
    folders = sorted(f for f in os.listdir(here)
                     if os.path.isfile(os.path.join(here, f, '__init__.py')))
    assert folders == ['averaging', 'guards', 'testing', 'trace',
                       'transports'], folders
