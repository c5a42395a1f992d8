"""A locally built verl wheel with one realistic one-line regression: the gate's seeded upgrade (issue 35).

`seeded_verl_wheel(out)` rebuilds the installed verl distribution as a wheel (its RECORD's files, read from
site-packages; no network) with `compute_grpo_outcome_advantage`'s `norm_adv_by_std_in_grpo` default flipped to
False -- the Dr. GRPO form, one keyword away in verl 0.9.1 core_algos.py -- under the local version
`<version>+seeded.advstd`, so it installs as the same release. `python -m harness.gate.seeded DIR` writes it and
prints its path.
"""
from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from importlib import metadata
from pathlib import Path

MODULE = "verl/trainer/ppo/core_algos.py"
FUNCTION = "def compute_grpo_outcome_advantage("
LINE = "    norm_adv_by_std_in_grpo: bool = True,\n"
SEEDED = "    norm_adv_by_std_in_grpo: bool = False,\n"
LOCAL = "seeded.advstd"


def patch(source: str) -> str:
    """The one-line regression: the first `norm_adv_by_std_in_grpo` default after FUNCTION. ValueError when the
    installed verl has no such line (another release: the seed names what it expected)."""
    at = source.find(FUNCTION)
    line = source.find(LINE, at) if at >= 0 else -1
    if line < 0 or source.find("\n)", at) < line:
        raise ValueError(f"{MODULE}: no `{LINE.strip()}` in {FUNCTION}...): not verl 0.9.1's signature")
    return source[:line] + SEEDED + source[line + len(LINE):]


def seeded_verl_wheel(out: str | Path, *, seeded: bool = True) -> Path:
    """The wheel in `out`; `seeded=False` rebuilds the installed verl unchanged (`+rebuilt`), the reference a gate
    must call SAFE."""
    dist = metadata.distribution("verl")
    version = f"{dist.version}+{LOCAL if seeded else 'rebuilt'}"
    old_info, new_info = f"verl-{dist.version}.dist-info", f"verl-{version}.dist-info"
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"verl-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(wheel.with_suffix(".part"), "w", zipfile.ZIP_DEFLATED) as zf:
        for file in dist.files or ():
            name = str(file)
            if "__pycache__" in name or name.startswith("..") or name.endswith("RECORD") or \
                    not (name.startswith("verl/") or name.startswith(old_info)):
                continue
            data = Path(dist.locate_file(file)).read_bytes()
            if name == MODULE and seeded:
                data = patch(data.decode()).encode()
            if name.startswith(old_info):
                name = new_info + name[len(old_info):]
                if name.endswith("/METADATA"):
                    data = data.replace(f"\nVersion: {dist.version}\n".encode(), f"\nVersion: {version}\n".encode())
                if name.endswith(("/direct_url.json", "/INSTALLER", "/REQUESTED")):
                    continue  # what pip wrote at install time, not part of a wheel
            zf.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        record.append(f"{new_info}/RECORD,,")
        zf.writestr(f"{new_info}/RECORD", "\n".join(record) + "\n")
    wheel.with_suffix(".part").replace(wheel)
    return wheel


if __name__ == "__main__":
    print(seeded_verl_wheel(sys.argv[1] if len(sys.argv) > 1 else "."))
