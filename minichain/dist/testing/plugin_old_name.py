"""What ``minichain.dist.pytest_plugin`` (the plugin's path until 2026-12)
imports as: a plugin that only loads the real one.

The old path cannot be an alias of the plugin module itself (as the other
moved modules are, minichain/dist/_moved.py): with autoload on, the entry
point registers that module under its new name, and pluggy refuses one
module object under two names. ``-p minichain.dist.pytest_plugin`` loads
this module instead, whose ``pytest_plugins`` loads the plugin once under
its own name (nothing when the entry point already did). Other names are
looked up in the plugin (``from minichain.dist.pytest_plugin import
MpiSpec`` still works); none is an attribute here, so pytest finds no hook
or fixture in this module to register twice.
"""
import importlib

pytest_plugins = ['minichain.dist.testing.pytest_plugin']


def __getattr__(name):
    if name.startswith('__'):  # import machinery probing (__path__): no
        raise AttributeError(name)
    plugin = importlib.import_module(pytest_plugins[0])
    return getattr(plugin, name)
