"""Built-in backends.

Each module here is a pluggy plugin using the same ``@cnncompare.hookimpl``
marker as third-party plugins. They are registered directly from
``BUILTIN_PLUGINS`` (not through entry points), so an uninstalled checkout
and the tests see them too. A new built-in backend goes in a module here,
listed below.
"""

BUILTIN_PLUGINS = (
    "cnncompare.backends.eager",
    "cnncompare.backends.torchscript",
    "cnncompare.backends.inductor",
    "cnncompare.backends.dynamo_bridge",
)
