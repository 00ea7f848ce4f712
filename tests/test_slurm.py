"""``maskattn grid run --launcher slurm`` against a real single-node Slurm cluster (issue 44): Debian's slurm-wlm +
munge started by ``scripts/slurm-single-node.sh`` (as root) unless a controller answers already, and stopped after
the session (only the daemons the fixture started).

Marked ``slurm``: excluded from the default run; ``.ci/run`` runs them in a step of their own with
``MASKATTN_REQUIRE_SLURM=1``, where a cluster that cannot be started fails the step. Elsewhere they skip with the
reason. One process (``-n 0``): the cluster is one per machine.

The 1-minute time-limit job is submitted first and followed last, so that its minutes overlap the other tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from _train_helpers import write_sentiment
from maskattn.grid.spec import load_grid

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.d_model=16", "model.num_heads=2", "model.ffn=false", "train.batch_size=16", "train.max_steps=6",
        "train.eval_every=3", "train.log_every=1", "data.dev_fraction=0.25", "optim.name=adam", "optim.lr=0.01",
        "train.num_threads=1"]
TIMING = {"elapsed_s", "examples_per_s", "tokens_per_s", "wall_s", "seconds", "train_seconds", "time_s"}


def _answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=15).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture(scope="session")
def slurm():
    """A Slurm controller that answers: the one running, or one started here for the session."""
    required = os.environ.get("MASKATTN_REQUIRE_SLURM") == "1"
    give_up = pytest.fail if required else pytest.skip
    if _answers():
        yield
        return
    if os.geteuid() != 0:
        give_up("Slurm is not running and starting it needs root (scripts/slurm-single-node.sh)")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "slurm-single-node.sh")], capture_output=True, text=True,
                          timeout=600)
    started = [line.split()[-1] for line in done.stdout.splitlines() if line.startswith("started ")]
    try:
        if done.returncode != 0 or not _answers():
            give_up(f"Slurm could not be started: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        yield
    finally:
        if started:
            subprocess.run(["bash", str(ROOT / "scripts" / "slurm-single-node.sh"), "stop", *reversed(started)],
                           timeout=120)


def grid_cli(*args, cwd: Path | None = None):
    """``maskattn grid ...`` in a process of its own (as a user runs it; submitit prints to the real stderr)."""
    done = subprocess.run([sys.executable, "-m", "maskattn.cli", "grid", *map(str, args)], capture_output=True,
                          text=True, timeout=900, cwd=cwd)
    return done.returncode, done.stdout + done.stderr


def status(folder: Path) -> dict[str, str]:
    """run name → the state ``grid status`` shows (with the job: ``queued (Slurm job 3_1)``)."""
    code, output = grid_cli("status", folder)
    assert code == 0, output
    lines = [line for line in output.splitlines() if ": " in line and not line.startswith(" ")
             and not re.match(r"\d+ runs: ", line)]
    return {line.split(": ", 1)[0]: line.split(": ", 1)[1].split(": ")[0] for line in lines}


def jobs_of(folder: Path) -> list[str]:
    """The Slurm jobs that are queued or running for runs of ``folder`` (by the job's name: ``grid:<folder name>``;
    each test's grid folder has a name of its own)."""
    names = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%j"], capture_output=True, text=True).stdout
    return [line.split("|")[0] for line in names.splitlines() if line.endswith(f"grid:{folder.name}")]


def wait_until(condition, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(poll)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def records(folder: Path) -> list[dict]:
    """A run's metrics rows without their timings."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").open()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def summary(folder: Path) -> dict:
    data = json.loads((folder / "summary.json").read_text())
    return {key: data[key] for key in ("test", "steps", "epochs", "best_dev", "best_step")}


def sets(items):
    return [a for item in items for a in ("--set", item)]


def tiny(**changes) -> list[str]:
    """:data:`TINY` with some of its ``train.`` settings changed (a key is given once)."""
    settings = dict(item.split("=", 1) for item in TINY)
    settings.update({f"train.{key}": str(value) for key, value in changes.items()})
    return [f"{key}={value}" for key, value in settings.items()]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_sentiment(tmp_path_factory.mktemp("slurm-data"))


STEPS = 40000


@pytest.fixture(scope="module")
def time_limited(slurm, data, tmp_path_factory):
    """A run of 40,000 steps in jobs of a 1-minute limit (warned 5 s before it), submitted before the other tests
    run. The run needs ~2 min of one idle core (3 ms a step: 16,000 steps finished inside one job on an idle
    machine) and a job trains ~50 s after its start-up, so the first job reaches its time limit and is requeued
    however fast the machine; a checkpoint every 1,000 steps lets every job get further."""
    out = tmp_path_factory.mktemp("slurm-timelimit") / "timelimit"
    steps = tiny(max_steps=STEPS, eval_every=1000, log_every=1000)
    code, output = grid_cli("run", "--out", out, "--data", data, *sets(steps), "--seeds", "0", "--launcher", "slurm",
                            "--slurm-time", "1")
    assert code == 0 and "submitted 1 run(s)" in output, output
    return out


def test_a_grid_through_slurm_is_submitted_once_and_matches_the_local_grid(time_limited, data, tmp_path):
    out, local = tmp_path / "slurm", tmp_path / "local"
    common = ["--data", data, *sets(TINY), "--seeds", "0-3"]
    code, output = grid_cli("run", "--out", out, *common, "--launcher", "slurm")
    assert code == 0, output
    assert "4 to submit" in output and "submitted 4 run(s)" in output and "grid status" in output
    launched = {run.name: json.loads((out / run.name / "launch.json").read_text()) for run in load_grid(out).runs}
    assert {launch["launcher"] for launch in launched.values()} == {"slurm"}
    first = status(out)
    assert set(first) == {"seed0", "seed1", "seed2", "seed3"}
    for name, state in first.items():  # each run with its job, wherever it is by now
        assert state.split(" (")[0] in ("queued", "running", "finished"), first
        assert f"Slurm job {launched[name]['job_id']}" in state, first
    before = jobs_of(out)

    code, again = grid_cli("run", "--out", out, "--launcher", "slurm")  # the same folder again: nothing submitted
    assert code == 0, again
    assert "0 to submit" in again and "submitted to Slurm: 0," in again and "run(s): Slurm job" not in again, again
    assert set(jobs_of(out)) <= set(before)  # no new job (some may have ended meanwhile)
    assert {name: json.loads((out / name / "launch.json").read_text())["job_id"] for name in launched} == \
        {name: launch["job_id"] for name, launch in launched.items()}

    code, local_too = grid_cli("run", "--out", out)  # the local launcher leaves them to their jobs
    assert code == 0 and "0 to run" in local_too, local_too

    code, waited = grid_cli("run", "--out", out, "--launcher", "slurm", "--wait")  # follow them to their end
    assert code == 0, waited
    assert status(out) == {name: f"finished (Slurm job {launched[name]['job_id']})" for name in launched}
    for name in launched:  # the job's files and stdout / stderr inside the grid folder
        job_folder = out / launched[name]["slurm_folder"]
        assert job_folder.is_relative_to(out / "slurm") and list(job_folder.glob("*_log.out"))

    code, output = grid_cli("run", "--out", local, *common, "--jobs", "2", "--threads", "1")
    assert code == 0, output
    for name in launched:
        assert summary(out / name) == summary(local / name), name
        assert records(out / name) == records(local / name), name
    code, output = grid_cli("run", "--out", out)  # continued with the other launcher: nothing left to do
    assert code == 0 and "4 finished earlier, 0 to run" in output, output


def test_a_cancelled_job_resumes_on_the_next_grid_run_bit_identically(slurm, data, tmp_path):
    out = tmp_path / "cancelled"
    steps = tiny(max_steps=1500, eval_every=50, log_every=50)
    code, output = grid_cli("run", "--out", out, "--data", data, *sets(steps), "--seeds", "0", "--launcher", "slurm")
    assert code == 0, output
    run = out / "seed0"
    job = json.loads((run / "launch.json").read_text())["job_id"]
    wait_until(lambda: (run / "last.safetensors").exists(), 300, "the run's first checkpoint", poll=0.1)
    subprocess.run(["scancel", job], check=True)
    wait_until(lambda: not jobs_of(out), 120, "the cancelled job to leave the queue")
    assert not (run / "summary.json").exists(), "the run finished before it was cancelled: make it longer"
    assert status(out) == {"seed0": f"stopped (Slurm job {job})"}
    assert json.loads((run / "worker.json").read_text())["outcome"] == "interrupted"

    code, output = grid_cli("run", "--out", out, "--launcher", "slurm", "--wait")
    assert code == 0 and "seed0: finished" in output, output
    second = json.loads((run / "launch.json").read_text())["job_id"]
    assert second != job and status(out) == {"seed0": f"finished (Slurm job {second})"}
    assert [r["step"] for r in records(run) if r["split"] == "train"] == list(range(50, 1501, 50))  # continued

    reference = tmp_path / "reference"
    code, output = grid_cli("run", "--out", reference, "--data", data, *sets(steps), "--seeds", "0", "--threads", "1")
    assert code == 0, output
    assert summary(run) == summary(reference / "seed0")
    for name in ("last.safetensors", "best.safetensors"):
        mine, theirs = load_file(run / name), load_file(reference / "seed0" / name)
        assert mine.keys() == theirs.keys() and all((mine[k] == theirs[k]).all() for k in mine), name
    assert records(run) == records(reference / "seed0")


def test_an_unknown_partition_is_refused_in_one_line_before_anything_is_submitted(slurm, data, tmp_path):
    out = tmp_path / "nosuch"
    code, output = grid_cli("run", "--out", out, "--data", data, *sets(TINY), "--seeds", "0", "--launcher", "slurm",
                            "--slurm-partition", "nosuch")
    assert code == 2, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "sbatch refused the jobs" in errors[0] and "--slurm-partition nosuch" in errors[0]
    assert not jobs_of(out) and not (out / "seed0" / "launch.json").exists()


def test_a_job_at_a_one_minute_time_limit_is_requeued_and_finishes(time_limited):
    out, run = time_limited, time_limited / "seed0"
    job = json.loads((run / "launch.json").read_text())["job_id"]
    code, output = grid_cli("run", "--out", out, "--launcher", "slurm", "--wait")
    assert code == 0 and ("seed0: finished" in output or "1 finished earlier" in output), output
    log = "".join(path.read_text() for path in (out / "slurm").glob("*/*_log.*"))
    assert f"Requeued job {job}" in log  # at its time limit: the same job, pending again
    last = json.loads((run / "launch.json").read_text())["job_id"]
    assert status(out) == {"seed0": f"finished (Slurm job {last})"}
    if last != job:  # a machine so loaded that the job wrote no checkpoint three times: the next grid run went on
        assert "not requeued: no checkpoint was written in its last 3 jobs" in log
    assert [r["step"] for r in records(run) if r["split"] == "train"] == list(range(1000, STEPS + 1, 1000))  # continued
    assert json.loads((run / "summary.json").read_text())["steps"] == STEPS
