"""The suites, a package only so that an installed wheel runs them by name: `pytest --pyargs
ascend_rl_harness_suites.suites` (pytest's --pyargs takes no namespace package). Its subdirectories stay plain
directories: each test module is imported by its own name, as in the checkout (pyproject.toml [tool.setuptools])."""
