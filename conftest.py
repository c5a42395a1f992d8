"""Root conftest: loads the fixture modules in fixtures/ (the pytest plugin itself comes from the
`pytest11` entry point of the installed package)."""
from pathlib import Path

import pytest

FIXTURES = sorted(
    f"fixtures.{p.stem}" for p in (Path(__file__).parent / "fixtures").glob("*.py") if not p.stem.startswith("_")
)
# Every fixture module is marked for assertion rewriting before the first is imported: they import one another
# (fixtures.consistency imports fixtures.engines), and pytest marks a plugin only as it imports it, so every run
# warned "PytestAssertRewriteWarning: Module already imported so cannot be rewritten: fixtures.engines" and that
# module's asserts lost their explanations (issue 33; tests/test_startup.py checks a clean run).
pytest.register_assert_rewrite(*FIXTURES)
pytest_plugins = FIXTURES
