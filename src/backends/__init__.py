"""Built-in backends.

Each module here is a pluggy plugin using the same ``@cnncompare.hookimpl``
marker as third-party plugins, registered from ``cnncompare.plugins.BUILTIN_PLUGINS``
(not through entry points), so an uninstalled checkout and the tests see them too.
A new built-in backend goes in a module here, listed there. The contract is
``backends/base.py``.
"""
