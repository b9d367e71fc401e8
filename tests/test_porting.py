"""docs/porting.md names every public name of Chainer v7.8.1 that minichain
does not have (tests/_chainer_names.py), and none that it has."""
import importlib
import importlib.util
import re
from pathlib import Path

from tests._chainer_names import NAMES

PAGE = Path(__file__).resolve().parent.parent / 'docs' / 'porting.md'
SECTION = '## Every Chainer name minichain does not have'


def _minichain_module(chainer_module):
    name = 'minichain' + chainer_module[len('chainer'):]
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _has(module, name):
    """An attribute, or a submodule that ``from module import name``
    would import."""
    return hasattr(module, name) or hasattr(module, '__path__') and \
        importlib.util.find_spec('{}.{}'.format(module.__name__,
                                                name)) is not None


def missing_names():
    """``{chainer module: names minichain lacks}``; a module minichain
    lacks as a whole is one name of its parent."""
    missing = {}
    for module, names in NAMES.items():
        ours = _minichain_module(module)
        if ours is None:
            continue
        lacks = {name for name in names if not _has(ours, name)}
        if lacks:
            missing[module] = lacks
    return missing


def listed_names(text):
    """``{module: names}`` from the section's ``- `module`: `a`, `b`...``
    items."""
    section = text.split(SECTION, 1)[1].split('\n## ', 1)[0]
    listed = {}
    for item in re.split(r'\n- ', '\n' + section)[1:]:
        module, *names = re.findall(r'`([^`]+)`', item.split('\n\n')[0])
        listed[module] = set(names)
    return listed


def test_the_page_lists_every_chainer_name_minichain_lacks():
    text = PAGE.read_text(encoding='utf-8')
    assert SECTION in text
    want, listed = missing_names(), listed_names(text)
    for module in sorted(set(want) | set(listed)):
        assert module in NAMES, 'porting.md lists an unknown module ' + module
        add = sorted(want.get(module, set()) - listed.get(module, set()))
        drop = sorted(listed.get(module, set()) - want.get(module, set()))
        assert not add and not drop, (
            'docs/porting.md, "{}", `{}`: add {} (minichain lacks them), '
            'remove {} (minichain has them now)'.format(
                SECTION[3:], module, add, drop))


def test_the_check_can_fail():
    listed = listed_names('{}\n\n- `chainer.functions`: `sin`, `cos`,\n'
                          '  `tan`\n- `chainer.links`: `GRU`\n\nprose `x`\n'
                          .format(SECTION))
    assert listed == {'chainer.functions': {'sin', 'cos', 'tan'},
                      'chainer.links': {'GRU'}}
    assert 'average' not in missing_names()['chainer.functions']
    assert 'sin' in missing_names()['chainer.functions']
