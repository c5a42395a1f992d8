"""Property test of the command line's argument validators (hypothesis; the plugin's `ci` profile keeps
the budget small): any argv built from each command's own options and hostile values ends in a result or a
one-line exit 2 naming what to fix -- never a traceback, never argparse's usage block or SystemExit.

The commands drawn are the ones whose valid argv answers in well under a second (scales, plan without --validate,
memory, launch --k8s); throughput/compare/baseline are drawn in test_metrics_properties.py, and the lab's and
launch's own validators have direct tests (tests/test_cli_help.py, tests/test_launch.py)."""
from __future__ import annotations

import contextlib
import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import build_parser, main, subcommands

PARSERS = dict(subcommands(build_parser()))
# argv every draw starts with; --k8s keeps launch from contacting a cluster
COMMANDS = {("scales",): [], ("plan",): [], ("memory",): [], ("launch",): ["--k8s"]}
NEVER = {"-h", "--help", "--validate", "--local", "--ray-address"}  # help exits; these start verl or Ray
VALUES = st.one_of(st.sampled_from(["0", "-1", "-3", "-5", "nan", "inf", "-inf", "1e400", "1e308", "5e-324",
                                    str(10**30), "1" + "0" * 400, str(2**64), "abc", "", "1", "3", "20",
                                    "0.5", "tiny", "full-a3", "full-a2-gbs128", "layer", "rollout", "prefill",
                                    "verl-ascend:latest", "rl; rm -rf /", "Shared_PVC", "$(id)", "--json"]),
                   st.text(max_size=8))


def _options(path: tuple[str, ...]) -> list[tuple[str, bool, tuple]]:
    """(option, takes a value, its choices) for every optional argument of the subcommand."""
    out = []
    for action in PARSERS[path]._actions:
        for option in action.option_strings:
            if option not in NEVER:
                out.append((option, action.nargs != 0, tuple(action.choices or ())))
    return out


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.data())
def test_any_argv_is_a_result_or_one_line_exit_2(data):
    path = data.draw(st.sampled_from(sorted(COMMANDS)))
    argv = [*path, *COMMANDS[path]]
    options = _options(path)
    for option, takes_value, choices in data.draw(st.lists(st.sampled_from(options), max_size=4)) if options else ():
        argv.append(option)
        if takes_value:
            argv.append(data.draw(st.one_of(st.sampled_from(choices), VALUES) if choices else VALUES))
    argv += data.draw(st.lists(VALUES, max_size=1))  # a stray positional or unknown option
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)  # SystemExit or any exception fails the property
    lines = err.getvalue().strip().splitlines()
    assert code in (0, 1, 2), (argv, code, lines)
    if code == 2:
        assert len(lines) == 1 and ": error: " in lines[0], (argv, lines)
