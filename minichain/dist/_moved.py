"""Old import paths of modules that moved into the layer folders.

Until 2026-12 ``minichain/dist`` was one flat folder; its guards, tracing,
transports and testing modules now live in folders of their own. Code and
commands written against the old paths (``import minichain.dist.watchdog``,
``python -m minichain.dist.timeline_plot``, ``-p minichain.dist.pytest_plugin``)
keep working: the old name is an alias of the *same* module object (one copy
of its state), not a second import of the file.
"""
import importlib
import importlib.abc
import importlib.util
import sys

OLD_TO_NEW = {
    'safety': 'guards.safety',
    'watchdog': 'guards.watchdog',
    'agreement': 'guards.agreement',
    'timeline': 'trace.timeline',
    'timeline_plot': 'trace.timeline_plot',
    'cost_model': 'trace.cost_model',
    'overlap': 'averaging.overlap',
    'pytest_plugin': 'testing.plugin_old_name',  # not the plugin: see there
}
_PREFIX = 'minichain.dist.'


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new_name):
        self.new_name = new_name

    def create_module(self, spec):
        return importlib.import_module(self.new_name)

    def exec_module(self, module):
        pass  # already executed under its new name

    def get_code(self, fullname):
        # ``python -m old.name`` runs the new module's code as __main__.
        spec = importlib.util.find_spec(self.new_name)
        return spec.loader.get_code(self.new_name)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_PREFIX):
            return None
        new = OLD_TO_NEW.get(fullname[len(_PREFIX):])
        if new is None:
            return None
        # origin: the new file, which ``python -m`` puts in sys.argv[0].
        origin = importlib.util.find_spec(_PREFIX + new).origin
        return importlib.util.spec_from_loader(
            fullname, _AliasLoader(_PREFIX + new), origin=origin)


def install():
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
