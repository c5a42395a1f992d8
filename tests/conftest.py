"""Self-tests of the harness. `pytester` runs the plugin in throw-away pytest sessions (tests/test_plugin.py)."""

pytest_plugins = ["pytester"]
