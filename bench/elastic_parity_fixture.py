"""Record DeepSpeed's ``compute_elastic_config`` answers over a grid, for the parity test.

DeepSpeed's wheel may ship without ``deepspeed/elasticity``; its source has it. This loads
the three files of that package (``elasticity.py``, ``config.py``, ``constants.py``) from a
DeepSpeed git checkout into a temporary package, with the two things they import from the
rest of DeepSpeed stubbed (a version string and a logger), and writes every answer to
``tests/fixtures/elastic_parity.json``. Run once, with an interpreter that has numpy and
packaging (DeepSpeed's own environment):

    $DS_VENV/bin/python bench/elastic_parity_fixture.py --git-dir PATH/TO/DeepSpeed/.git --rev HEAD

With DeepSpeed installed in that interpreter, the fixture also records what the installed
release does with an ``elasticity`` block (``installed``): DeepSpeed 0.19.8 has removed the
package, and its config refuses the block. The answers above then come from the last
source that has it (the ``rev`` recorded).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "elastic_parity.json"
FILES = ("elasticity.py", "config.py", "constants.py")
WORLDS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 30)


def _load(git_dir: str, rev: str, into: Path) -> Any:
    pkg = into / "dspeer"
    (pkg / "elasticity").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "git_version_info.py").write_text("version = '0.19.8'\n")
    (pkg / "utils.py").write_text("import logging\nlogger = logging.getLogger('dspeer')\n")
    (pkg / "elasticity" / "__init__.py").write_text("")
    for name in FILES:
        text = subprocess.run(["git", "--git-dir", git_dir, "show", f"{rev}:deepspeed/elasticity/{name}"],
                              check=True, capture_output=True, text=True).stdout
        (pkg / "elasticity" / name).write_text(text)
    sys.path.insert(0, str(into))
    return importlib.import_module("dspeer.elasticity.elasticity")


def _blocks() -> list[dict[str, Any]]:
    blocks = []
    micro_sets = ([2, 4, 6], [1], [3, 5], [8, 12], [2, 3, 7], [16], [4, 64])
    for version, cap, micro, larger, gpus in itertools.product(
            (0.1, 0.2), (16, 100, 2000), micro_sets, (True, False), ((1, 10000), (2, 8), (3, 3))):
        blocks.append({"enabled": True, "version": version, "max_train_batch_size": cap, "micro_batch_sizes": micro,
                       "prefer_larger_batch": larger, "min_gpus": gpus[0], "max_gpus": gpus[1]})
    for per_node, mp in ((2, 1), (4, 1), (4, 2), (8, 4), (3, 2)):
        blocks.append({"enabled": True, "version": 0.2, "max_train_batch_size": 1024, "micro_batch_sizes": [2, 4],
                       "num_gpus_per_node": per_node, "model_parallel_size": mp, "min_gpus": per_node,
                       "max_gpus": 8 * per_node})
    blocks += [{"enabled": True, "micro_batch_sizes": [2]}, {"enabled": True, "max_train_batch_size": 8},
               {"enabled": True, "max_train_batch_size": 8, "micro_batch_sizes": 2},
               {"enabled": True, "max_train_batch_size": 8, "micro_batch_sizes": [2], "min_gpus": 4, "max_gpus": 2},
               {"enabled": True, "max_train_batch_size": 8, "micro_batch_sizes": [2], "version": 0.3},
               {"enabled": True, "max_train_batch_size": 8, "micro_batch_sizes": [2], "version": 0.1,
                "model_parallel_size": 2}]
    return blocks


def _answer(ds: Any, block: dict[str, Any], world: int) -> dict[str, Any]:
    try:
        out = ds.compute_elastic_config({"elasticity": block}, "0.19.8", world_size=world,
                                        return_microbatch=world > 0)
    except Exception as err:  # every failure is an answer: its class is recorded
        return {"error": type(err).__name__}
    batch, worlds = int(out[0]), [int(w) for w in out[1] or []]  # None: no candidate had a valid world
    return {"batch": batch, "worlds": worlds, "micro": None if world == 0 else int(out[2])}


def _installed() -> dict[str, Any] | None:
    """The installed DeepSpeed's version, whether it has the package, and its answer to a config with the block."""
    try:
        import deepspeed
        from deepspeed.runtime import config as ds_config
    except ImportError:
        return None
    try:
        importlib.import_module("deepspeed.elasticity")
        has_package = True
    except ImportError:
        has_package = False
    record: dict[str, Any] = {"version": deepspeed.__version__, "has_elasticity_package": has_package}
    block = {"train_batch_size": 8, "elasticity": {"enabled": True, "max_train_batch_size": 8,
                                                   "micro_batch_sizes": [2]}}
    reject = getattr(ds_config, "_reject_removed_config_keys", None)
    try:
        if reject is not None:
            reject(block)
        record["config_answer"] = "accepted"
    except Exception as err:  # the installed release's refusal is the answer
        record["config_answer"] = {"error": type(err).__name__, "message": str(err)}
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", required=True, help="a DeepSpeed repository's git directory")
    parser.add_argument("--rev", default="HEAD", help="the revision whose deepspeed/elasticity to load")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ds = _load(args.git_dir, args.rev, Path(tmp))
        cases = [{"block": b, "answers": {str(w): _answer(ds, b, w) for w in WORLDS}} for b in _blocks()]
    lines = ",\n".join(json.dumps(case, separators=(",", ":")) for case in cases)
    commit = subprocess.run(["git", "--git-dir", args.git_dir, "rev-parse", args.rev], check=True,
                            capture_output=True, text=True).stdout.strip()
    installed = json.dumps(_installed(), separators=(",", ":"))
    OUT.write_text(f'{{"rev": {json.dumps(commit)}, "installed": {installed}, "cases": [\n{lines}\n]}}\n')
    print(f"wrote {len(cases)} blocks x {len(WORLDS)} worlds to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
