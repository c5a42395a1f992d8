"""Root conftest: loads the fixture modules in fixtures/ (the pytest plugin itself comes from the
`pytest11` entry point of the installed package)."""
from pathlib import Path

pytest_plugins = sorted(
    f"fixtures.{p.stem}" for p in (Path(__file__).parent / "fixtures").glob("*.py") if not p.stem.startswith("_")
)
