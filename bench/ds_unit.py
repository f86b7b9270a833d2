"""DeepSpeed's own unit tests, run under DeepSpeed and under zerorun's drop-in: the acceptance table.

Takes a DeepSpeed source checkout (its ``tests/`` folder is the suite; nothing of it is
copied into this project) and a venv with DeepSpeed installed (with pytest; see
shared/peers/README.md for the CPU venv), runs the chosen test files once with DeepSpeed
and once with zerorun answering ``import deepspeed`` (and the ``deepspeed``/``ds_report``
commands on PATH), and prints, per file, how many tests pass on DeepSpeed, how many of
those pass on zerorun, and why the others fail::

    python bench/ds_unit.py --ds-source /path/to/DeepSpeed --ds-venv /path/to/venv-peers
    python bench/ds_unit.py --ds-source ... --ds-venv ... --files unit/launcher/test_run.py --json out.json

The tests run from a scratch copy of ``tests/``: DeepSpeed's conftest puts the folder
above it on ``sys.path``, which in the checkout would import the checkout's own
``deepspeed/`` sources instead of the engine under test. The zerorun run needs the
harness's own imports in zerorun's venv (``pip install hjson``: DeepSpeed's config tests
import it directly); ``--test-timeout`` needs ``pytest-timeout`` in both venvs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FILES = ("checkpoint/test_convert_checkpoint.py", "checkpoint/test_latest_checkpoint.py",
         "checkpoint/test_reshape_checkpoint.py", "checkpoint/test_shared_weights.py",
         "checkpoint/test_tag_validation.py", "launcher/test_ds_arguments.py", "launcher/test_multinode_runner.py",
         "launcher/test_run.py", "launcher/test_user_args.py", "runtime/test_ds_config_dict.py",
         "runtime/test_ds_config_model.py", "runtime/test_lr_schedulers.py", "runtime/zero/test_zero_config.py",
         "v1/half_precision/test_gradient_clipping_default.py")
"""The files of the table in the issue that asked for this suite (DeepSpeed's ``tests/unit/``)."""

ZERO_FILES = ("runtime/zero/", "v1/zero/", "runtime/test_ds_initialize.py", "runtime/test_no_sync_ctxt.py",
              "runtime/test_multiple_models.py", "comm/", "checkpoint/test_zero_optimizer.py")
"""The ZeRO engine's own tests (``--set zero``): folders run file by file."""

SETS = {"table": FILES, "zero": ZERO_FILES}


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """``{file::test: (outcome, first line of the failure)}`` from a pytest JUnit XML report."""
    result: dict[str, tuple[str, str]] = {}
    if not junit.is_file():
        return result
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "")
        name = (f"{module.replace('.', '/')}::{case.get('name')}" if module
                else f"{(case.get('name') or '').replace('.', '/')}::<collection>")  # a file that failed to import
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if case.find("skipped") is not None:
            result[name] = ("skipped", "")
        elif bad is not None:
            result[name] = ("failed", (bad.get("message") or "").splitlines()[0][:110] if bad.get("message") else "")
        else:
            result[name] = ("passed", "")
    return result


def expand(tests: Path, files: list[str]) -> list[str]:
    """The files, with a folder (``runtime/zero/``) replaced by its ``test_*.py`` files, sorted."""
    out: list[str] = []
    for f in files:
        folder = tests / "unit" / f
        out += ([str(t.relative_to(tests / "unit")) for t in sorted(folder.glob("test_*.py"))] if folder.is_dir()
                else [f])
    return out


def node_ids(junit: Path, tests: Path) -> list[str]:
    """The pytest node ids (``unit/x/test_f.py::Class::test[p]``) of the tests a JUnit report says passed."""
    ids = []
    if not junit.is_file():
        return ids
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None or case.find("skipped") is not None:
            continue
        parts = (case.get("classname") or "").split(".")
        cut = next((i for i in range(len(parts), 0, -1) if (tests / Path(*parts[:i])).with_suffix(".py").is_file()), 0)
        if cut:
            ids.append("::".join(["/".join(parts[:cut]) + ".py", *parts[cut:], case.get("name") or ""]))
    return ids


def run_file(python: str, tests: Path, file: str, env: dict[str, str], junit: Path, timeout: int,
             keep: Path | None = None) -> None:
    """One pytest run of one file: a hang costs that file alone (its tests then count as not run).

    With ``keep``, the report is also kept there, and a report already there is used instead of a run
    (DeepSpeed's side of the table does not change between runs of zerorun's).
    """
    kept = keep / junit.name if keep else None
    if kept and kept.is_file():
        shutil.copyfile(kept, junit)
        return
    _pytest(python, tests, file, env, junit, timeout)
    if kept and junit.is_file():
        shutil.copyfile(junit, kept)


def _from_keep(keep: Path | None, junit: Path) -> None:
    """The report kept under ``keep`` from an earlier run, when there is one."""
    if keep and (keep / junit.name).is_file():
        shutil.copyfile(keep / junit.name, junit)


def _pytest(python: str, tests: Path, file: str, env: dict[str, str], junit: Path, timeout: int,
            only: list[str] | None = None) -> None:
    """One pytest run of one file (or of the node ids ``only``) in its own session; past ``timeout`` the
    whole session (ranks too) is killed."""
    select = ["-k", env["DS_UNIT_SELECT"]] if env.get("DS_UNIT_SELECT") else []  # --select
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
           *(only if only is not None else [f"unit/{file}"]), *select]
    if env.get("DS_UNITTEST_TIMEOUT"):  # per test: the guard plugin fails that test alone (bench/ds_unit_guard.py)
        cmd[3:3] = ["-p", "ds_unit_guard", f"--timeout={env['DS_UNITTEST_TIMEOUT']}"]
    log = junit.with_suffix(".log")
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=tests, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the rank processes it started are in its session
            proc.wait()
            return
    if not junit.is_file():  # pytest stopped before any test (a usage error: say it, or the table reads 0 of 0)
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        print(f"{file}: pytest wrote no report (exit {proc.returncode}):", *tail, sep="\n  ", file=sys.stderr)


def in_file(name: str, f: str) -> bool:
    """Whether the JUnit name ``unit/launcher/test_run::test_x`` (or ``.../test_run/TestX::t``) is in ``f``."""
    path = name.split("::")[0].removeprefix("unit/")
    stem = f.removesuffix(".py")
    return path == stem or path.startswith(stem + "/")


def _reason(zr: dict[str, tuple[str, str]], name: str, f: str) -> str:
    if name in zr:
        return zr[name][1] or zr[name][0]
    broken = [why for n, (_, why) in zr.items() if n.endswith("::<collection>") and in_file(n, f)]
    return f"import: {broken[0]}" if broken else "not run"


def table(ds: dict[str, tuple[str, str]], zr: dict[str, tuple[str, str]], files: list[str]) -> list[dict]:
    """Per file: tests passing on DeepSpeed, of those passing on zerorun, and the commonest reasons of the rest."""
    rows = []
    for f in files:
        passing = [n for n, (o, _) in ds.items() if in_file(n, f) and o == "passed"]
        ours = [n for n in passing if zr.get(n, ("missing", ""))[0] == "passed"]
        why = Counter(_reason(zr, n, f) for n in passing if n not in ours)
        rows.append({"file": f, "deepspeed": len(passing), "zerorun": len(ours),
                     "failing": [f"{c}x {w}" for w, c in why.most_common(3)],
                     "measured": any(in_file(n, f) for n in ds)})  # False: no DeepSpeed report (not run)
    return rows


def markdown(rows: list[dict], commit: str) -> str:
    lines = [f"DeepSpeed tests/unit at {commit}", "",
             "| DeepSpeed test file | pass on DeepSpeed | pass on zerorun | what fails on zerorun |", "|---|---|---|---|"]
    lines += [f"| {r['file']} | {r['deepspeed']} | {r['zerorun']} | {'; '.join(r['failing'])} |"
              if r.get("measured", True) else f"| {r['file']} | not run | not run | |" for r in rows]
    ds, zr = sum(r["deepspeed"] for r in rows), sum(r["zerorun"] for r in rows)
    lines.append(f"| **all** | **{ds}** | **{zr}** ({100 * zr / max(ds, 1):.0f} %) | |")
    return "\n".join(lines)


def scratch_tests(source: Path, into: Path) -> tuple[Path, str]:
    """A copy of the checkout's ``tests/`` (its git HEAD when it is a repository) and the commit it is."""
    commit = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"
    if (source / "tests").is_dir():
        shutil.copytree(source / "tests", into / "tests")
    else:  # a bare mirror: take tests/ from HEAD
        archive = subprocess.run(["git", "-C", str(source), "archive", "HEAD", "tests"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "tests", commit


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ds-source", required=True, type=Path, help="a DeepSpeed checkout (or bare mirror)")
    p.add_argument("--ds-venv", required=True, type=Path, help="a venv with DeepSpeed and pytest installed")
    p.add_argument("--zerorun-python", default=sys.executable, help="the Python of zerorun's venv (default: this one)")
    p.add_argument("--files", nargs="*", help="files (or folders) under tests/unit/ (default: the --set's)")
    p.add_argument("--set", choices=sorted(SETS), default="table", help="a named list of files (default: table)")
    p.add_argument("--engines", choices=("both", "deepspeed", "zerorun", "none"), default="both",
                   help="which side to run (none: only the table, from the reports under --keep)")
    p.add_argument("--keep", type=Path, help="a folder keeping each file's reports; reports there are reused")
    p.add_argument("--timeout", type=int, default=900, help="seconds per file and engine")
    p.add_argument("--test-timeout", type=int, default=0,
                   help="seconds per test: past it (or at a failure) the test's rank processes are killed and that "
                        "test alone fails (bench/ds_unit_guard.py; 0: DeepSpeed's harness as it is)")
    p.add_argument("--only-passing", action="store_true",
                   help="run on zerorun only the tests that pass on DeepSpeed (its reports under --keep; waits for "
                        "a concurrent --engines deepspeed run to write each)")
    p.add_argument("--json", type=Path, help="also write the rows as JSON")
    p.add_argument("-k", "--select", default="",
                   help="only the tests pytest's -k expression selects, on both engines (a sample of a large file)")
    p.add_argument("--devices", type=int, default=2, help="CPU 'devices' DeepSpeed's harness may use (LOCAL_SIZE)")
    ns = p.parse_args(argv)
    ns.zerorun_python = os.path.abspath(ns.zerorun_python)  # the runs start in the scratch tests folder
    from zerorun.compat.ds_commands_link import link

    with tempfile.TemporaryDirectory(prefix="ds-unit-") as tmp:
        work = Path(tmp)
        tests, commit = scratch_tests(ns.ds_source, work)
        files = expand(tests, ns.files or list(SETS[ns.set]))
        if ns.keep:
            ns.keep.mkdir(parents=True, exist_ok=True)
        base = {k: v for k, v in os.environ.items() if not k.startswith("ZERORUN_")}
        # DeepSpeed's CPU accelerator counts its "devices" from LOCAL_SIZE; without it every world-2 test skips
        base.update(DS_ACCELERATOR="cpu", PYTHONDONTWRITEBYTECODE="1", LOCAL_SIZE=str(ns.devices))
        # DeepSpeed's harness starts its ranks without a thread count: two ranks of two threads on two cores
        # made a step ~30x slower (both engines alike), so tests timed out on load, not on a difference
        base.setdefault("OMP_NUM_THREADS", "1")
        if ns.select:  # read by _pytest: both engines run the same sample
            base["DS_UNIT_SELECT"] = ns.select
        if ns.test_timeout:
            base.update(DS_UNITTEST_TIMEOUT=str(ns.test_timeout),
                        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "bench"), base.get("PYTHONPATH")])))
        ds_env = {**base, "PATH": f"{ns.ds_venv / 'bin'}{os.pathsep}{base['PATH']}"}
        (work / "bin").mkdir()
        link(work / "bin", python=ns.zerorun_python, path=[])  # zerorun's venv has no DeepSpeed to shadow
        zr_env = {**base, "ZERORUN_AS_DEEPSPEED": "force", "PATH": f"{work / 'bin'}{os.pathsep}{base['PATH']}"}
        ds: dict[str, tuple[str, str]] = {}
        zr: dict[str, tuple[str, str]] = {}
        rows: list[dict] = []
        for i, f in enumerate(files):
            slug = f.replace("/", "-").removesuffix(".py")
            ds_xml, zr_xml = work / f"ds-{slug}.xml", work / f"zr-{slug}.xml"
            if ns.engines in ("both", "deepspeed"):  # DeepSpeed's report is reused from --keep when there
                run_file(str(ns.ds_venv / "bin" / "python"), tests, f, ds_env, ds_xml, ns.timeout, ns.keep)
                if ns.keep:  # a file whose run left no report is done all the same (see --only-passing)
                    (ns.keep / f"done-{slug}").touch()
            else:
                _from_keep(ns.keep, ds_xml)
            if ns.engines in ("both", "zerorun"):  # zerorun's always runs afresh
                only = None
                if ns.only_passing:  # DeepSpeed's report first (another run may be writing it), then its passes
                    while not ds_xml.is_file() and ns.keep and not (ns.keep / f"done-{slug}").exists():
                        time.sleep(20)
                        _from_keep(ns.keep, ds_xml)
                    only = node_ids(ds_xml, tests)
                if only != []:
                    _pytest(ns.zerorun_python, tests, f, zr_env, zr_xml, ns.timeout, only)
                if ns.keep and zr_xml.is_file():
                    shutil.copyfile(zr_xml, ns.keep / zr_xml.name)
            else:
                _from_keep(ns.keep, zr_xml)
            ds.update(outcomes(ds_xml))
            zr.update(outcomes(zr_xml))
            print(f"{f}: {sum(o == 'passed' for n, (o, _) in ds.items() if in_file(n, f))} on DeepSpeed, "
                  f"{sum(o == 'passed' for n, (o, _) in zr.items() if in_file(n, f))} on zerorun", file=sys.stderr)
            rows = table(ds, zr, files[:i + 1])
            if ns.json:  # after every file: a run cut short keeps the files it finished
                ns.json.write_text(json.dumps({"commit": commit, "rows": rows}, indent=2))
    print(markdown(rows, commit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
