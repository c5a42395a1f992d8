"""Root conftest: loads the fixture modules in fixtures/ (the pytest plugin itself comes from the
`pytest11` entry point of the installed package)."""
import os
import sys
from pathlib import Path

import pytest

# Bytecode is cached for this session and every Python child it starts (they inherit os.environ; xdist's workers
# start after this file is read). The suite starts many children that run pytest (`run`, seeded trees, the gate's
# sides): where the environment sets PYTHONDONTWRITEBYTECODE (this host's image does), each one compiled the harness
# again and re-rewrote the asserts of every module of the pytest plugins' packages (hypothesis, hydra, anyio,
# pytest_benchmark: 187 modules), ~2.5 CPU-s and ~4 s of wall time a child on this 2-core host.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

FIXTURES = sorted(
    f"fixtures.{p.stem}" for p in (Path(__file__).parent / "fixtures").glob("*.py") if not p.stem.startswith("_")
)
# Every fixture module is marked for assertion rewriting before the first is imported: they import one another
# (fixtures.consistency imports fixtures.engines), and pytest marks a plugin only as it imports it, so every run
# warned "PytestAssertRewriteWarning: Module already imported so cannot be rewritten: fixtures.engines" and that
# module's asserts lost their explanations (issue 33; tests/test_startup.py checks a clean run).
pytest.register_assert_rewrite(*FIXTURES)
pytest_plugins = FIXTURES
