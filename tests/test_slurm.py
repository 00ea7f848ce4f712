"""``maskattn grid run --launcher slurm`` against a real single-node Slurm cluster (issue 44): Debian's slurm-wlm +
munge started by ``scripts/slurm-single-node.sh`` (as root) unless a controller answers already, and stopped at the
module's end (only the daemons the fixture started, after cancelling the jobs left on it), so that
tests/test_slurm_multinode.py can start its two-node cluster next: one machine holds one controller.

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


def _drain(timeout: float = 60) -> None:
    """Cancel this user's jobs and wait until the queue is empty (no job step outlives its slurmd)."""
    import getpass

    subprocess.run(["scancel", "-u", getpass.getuser()], capture_output=True, timeout=60)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and subprocess.run(["squeue", "-h"], capture_output=True, text=True,
                                                         timeout=30).stdout.strip():
        time.sleep(1)


@pytest.fixture(scope="module")
def slurm():
    """A Slurm controller that answers: the one running, or one started here for the module and stopped at its
    end."""
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
            _drain()
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


def test_what_sbatch_refuses_is_refused_in_one_line_before_anything_is_written(slurm, data, tmp_path):
    """An unknown partition, memory no node has: sbatch --test-only refuses them before the grid writes anything
    (grid.json, .grid-submit and submitit's files were left behind by the refusal of the real submission)."""
    for option, value, named in (("--slurm-partition", "nosuch", "(--slurm-partition nosuch)"),
                                 ("--slurm-mem", "100000G", "(no node has what --slurm-mem 100000G asks for)")):
        out = tmp_path / value
        code, output = grid_cli("run", "--out", out, "--data", data, *sets(TINY), "--seeds", "0", "--launcher",
                                "slurm", option, value)
        assert code == 2, output
        errors = [line for line in output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "sbatch refused the jobs" in errors[0] and named in errors[0], output
        assert not jobs_of(out) and not out.exists()


PROBE = """import os, signal, subprocess, sys, time
log = sys.argv[1]
restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
with open(log, "a") as f:
    f.write(f"start {restarts} {time.time()}\\n")
def warned(signum, frame):
    with open(log, "a") as f:
        f.write(f"usr2 {restarts} {time.time()}\\n")
    if restarts == 0:
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=True)
    os._exit(0)
signal.signal(signal.SIGUSR2, warned)
while True:
    time.sleep(0.1)
"""


def _warnings(tmp_path: Path, delay: int) -> list[float]:
    """Seconds from each start of a 1-minute job (--signal=USR2@delay, as submitit asks) to its warning: the job
    requeues itself at its first warning and ends at its second."""
    (tmp_path / "probe.py").write_text(PROBE)
    log = tmp_path / f"delay{delay}.log"
    script = tmp_path / f"delay{delay}.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --time=1\n#SBATCH --signal=USR2@{delay}\n#SBATCH --requeue\n"
                      f"#SBATCH --output={tmp_path}/delay{delay}.out\n#SBATCH --open-mode=append\n"
                      f"srun --ntasks=1 {sys.executable} {tmp_path / 'probe.py'} {log}\n")
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True)
    job_id = job.stdout.strip().split(";")[0]
    wait_until(lambda: log.exists() and log.read_text().count("usr2") >= 2, 300, f"two warnings of job {job_id}",
               poll=1)
    subprocess.run(["scancel", job_id])
    events = [line.split() for line in log.read_text().splitlines()]
    starts = {int(n): float(t) for kind, n, t in events if kind == "start"}
    return [float(t) - starts[int(n)] for kind, n, t in events if kind == "usr2"]


def test_the_warning_before_the_time_limit_comes_within_30_s_of_the_delay_after_each_start(slurm, tmp_path):
    """Slurm looks at running jobs every 30 s and warns at the first look within delay + 30 s of the end, counted
    from each start — a requeued job's too: a 1-minute job warned 20 s before is warned 10–40 s after each start;
    one warned 45 s before (too long: maskattn refuses it) is inside that distance from its start, so it is warned
    at the first look after each start, anywhere in its first 30 s (a requeued job was warned 0.1 s after it
    started, before its worker had trained anything)."""
    slack = 3  # slurmd and srun relaying the signal, the probe's start
    fine = _warnings(tmp_path, 20)
    assert len(fine) == 2 and all(60 - 20 - 30 - slack <= gap <= 60 - 20 + slack for gap in fine), fine
    early = _warnings(tmp_path, 45)
    assert len(early) == 2 and all(0 <= gap <= 30 + slack for gap in early), early
    code, output = grid_cli("run", "--out", tmp_path / "refused", "--data", tmp_path, "--seeds", "0", "--launcher",
                            "slurm", "--slurm-time", "1", "--slurm-signal-delay", "45")
    assert code == 2 and "--slurm-signal-delay 45: at most 15 s with a 1-minute time limit" in output, output


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
