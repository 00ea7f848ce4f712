"""One run on several machines (issue 56): ``maskattn train`` as the tasks of a Slurm job step (``srun``), and
``maskattn grid run --launcher slurm --slurm-nodes N`` — against a real two-node Slurm cluster on this machine
(``scripts/slurm-two-node.sh``: nodes n1 and n2, two slurmd sharing the file system), started by the module's
fixture as root unless a cluster of two nodes or more answers already, and stopped at the module's end (only the
daemons it started, after cancelling the jobs left on it).

The tests that need the cluster are marked ``slurm`` (excluded from the default run; ``.ci/run`` runs this file
after tests/test_slurm.py, serially: one machine holds one controller, and each module stops its cluster at its
end). The others check, without a cluster, what is refused before anything is written.

**The tolerance of "the same model as one process".** Two processes add the per-example terms of the loss and of
its gradient in another order than one process does (each sums its 8 examples of the global batch of 16; the
all-reduce adds the two sums; the scale 2/16 = 1/8 is a power of two, exact): a float32 sum of n terms taken in
another order differs by at most (n − 1)·u of the terms' magnitude, u = 2^-24, so 15u ≈ 9e-7 per reduction of the
batch. Eight SGD steps with momentum 0.9 carry each step's difference into the weights at most 1 / (1 − 0.9) = 10
times over: 8 · 10 · 15u ≈ 7e-5. The losses are compared within a relative 1e-4 (that bound, rounded up) and the
accuracies exactly (a prediction flips only at a logit margin under ~1e-6). Measured: the weights of the two runs
differ by at most 5e-7 and the logged losses by at most 2e-7 relatively. Two processes on two nodes are the same
arithmetic as two on one machine (a two-term sum does not depend on its order): a preempted, cancelled and resumed
two-node run ends bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from safetensors.torch import load_file
from typer.testing import CliRunner

from _train_helpers import sentiment_lines
from maskattn.cli import app
from maskattn.errors import ArgumentError
from maskattn.train.distributed import PORT_BASE, PORT_SPAN, SlurmTasks, derived_port, rendezvous, slurm_tasks
from test_slurm import _answers, _drain, grid_cli, jobs_of, records, sets, status, summary, wait_until

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm-two-node.sh"
#: the CR preset made tiny; without dropout and with SGD, so that one process and two are compared by gradients
SMALL = ["model.d_model=16", "model.dropout=0", "model.attention_dropout=0", "train.batch_size=16",
         "train.max_steps=8", "train.eval_every=4", "train.log_every=1", "optim.name=sgd", "optim.lr=0.5",
         "optim.momentum=0.9", "train.num_threads=1"]
#: a longer run, to be stopped in the middle: dropout on, and a batch of 15 (shares of 8 and 7 examples draw their
#: dropout masks differently: an exact resume gives each process its own generator back)
LONG = ["model.d_model=16", "model.dropout=0.1", "model.attention_dropout=0.2", "train.batch_size=15",
        "train.max_steps=600", "train.eval_every=50", "train.log_every=50", "optim.name=sgd", "optim.lr=0.05",
        "optim.momentum=0.9", "train.num_threads=1"]
RTOL = 1e-4  # module docstring
SLURM_VARS = ("SLURM_", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASKATTN_RENDEZVOUS",
              "MASKATTN_DIST")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without Slurm's or torchrun's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(SLURM_VARS)}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


# --- without a cluster: what is refused before anything is written -------------------------------------------------

def test_the_process_group_is_read_from_slurms_environment_of_a_task():
    task = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2",
            "SLURM_JOB_ID": "123", "SLURM_STEP_NODELIST": "nodeA,nodeB", "SLURM_JOB_NODELIST": "nodeA,nodeB"}
    tasks = slurm_tasks({**task, "MASTER_ADDR": "10.0.0.1"})
    assert tasks == SlurmTasks(1, 2, 0, "10.0.0.1", "10.0.0.1", PORT_BASE + 123, "123",
                               f"derived from SLURM_JOB_ID 123: {PORT_BASE} + id mod {PORT_SPAN}")
    assert derived_port("40123") == derived_port("123") == 20123 and derived_port("39999") == 59999
    assert slurm_tasks({**task, "MASTER_ADDR": "h", "MASTER_PORT": "29500"}).port == 29500  # type: ignore[union-attr]
    assert slurm_tasks({**task, "MASTER_ADDR": "h", "RANK": "1"}) is not None  # a grid job's worker: RANK = PROCID
    for not_slurm in ({**task, "WORLD_SIZE": "2"},  # torchrun's environment wins
                      {k: v for k, v in task.items() if k != "SLURM_STEP_ID"},  # the batch script: one process
                      {**task, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, {}):
        assert slurm_tasks(not_slurm) is None
    for bad, message in (({"RANK": "0"}, "RANK='0' and SLURM_PROCID 1 disagree"),
                         ({"SLURM_PROCID": "2"}, "SLURM_PROCID 2: expected a rank below SLURM_NTASKS 2"),
                         ({"MASTER_PORT": "70000"}, "MASTER_PORT 70000: expected a port from 1 to 65535"),
                         ({"SLURM_NTASKS": "two"}, "SLURM_NTASKS='two': expected an integer")):
        with pytest.raises(ArgumentError, match=re.escape(message)):
            slurm_tasks({**task, "MASTER_ADDR": "h", **bad})


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_tasks_that_disagree_on_the_world_size_are_refused_by_every_task():
    port = _free_port()
    said: dict[int, str] = {}

    def task(rank: int, world: int) -> None:
        try:
            rendezvous(SlurmTasks(rank, world, 0, "n1", "127.0.0.1", port, "7", "set in the environment"), 20)
            said[rank] = "joined"
        except ArgumentError as exc:
            said[rank] = str(exc)

    threads = [threading.Thread(target=task, args=(0, 2)), threading.Thread(target=task, args=(1, 3))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert said[0].startswith("the Slurm tasks disagree on the world size: rank 0 has SLURM_NTASKS 2, rank 1 has 3;")
    assert said[1].startswith("the Slurm tasks disagree on the world size: rank 1 has SLURM_NTASKS 3, rank 0 has 2;")



def test_the_first_task_keeps_the_rendezvous_up_until_the_others_have_read_its_verdict():
    """The store lives in the first task's process: a refusal there must not close it before a slower task has read
    why (before, the second task of the test above could meet a closed store — a ``DistNetworkError`` instead of the
    one-line refusal — when the first one raised as soon as it had written its verdict). Here the second task is a
    bare store client that waits a second before reading the verdict, then says it has heard it."""
    port = _free_port()
    said: dict[int, str] = {}

    def first() -> None:
        try:
            rendezvous(SlurmTasks(0, 2, 0, "n1", "127.0.0.1", port, "7", "set in the environment"), 20)
        except ArgumentError as exc:
            said[0] = str(exc)

    thread = threading.Thread(target=first)
    thread.start()
    client = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=20), wait_for_workers=False)
    client.set("maskattn/7/world/1", "3")
    time.sleep(1.0)
    assert client.get("maskattn/7/verdict").decode().startswith("the Slurm tasks disagree on the world size: rank 0")
    assert thread.is_alive()  # still holding the store for the task that has not said it heard
    client.set("maskattn/7/heard/1", "1")
    thread.join(8)  # well under the 10 s it would hold the store for a task that never says so
    assert not thread.is_alive() and said[0].startswith("the Slurm tasks disagree on the world size")

def train_cli(out: Path, data: Path, settings: list[str]):
    return CliRunner().invoke(app, ["train", "--preset", "cr", "--data", str(data), *sets(settings), "--out",
                                    str(out), "--no-progress"], catch_exceptions=False)


@pytest.fixture(scope="module")
def cr_data(tmp_path_factory) -> Path:
    """The CR preset's file (``all.tsv``, label<TAB>text; ten folds, fold 0 the test split) of the tiny task."""
    folder = tmp_path_factory.mktemp("cr") / "cr"
    folder.mkdir()
    (folder / "all.tsv").write_text("\n".join(sentiment_lines(160, 0)) + "\n")
    return folder


def test_a_taken_port_and_an_unreachable_first_node_are_one_line_before_anything_is_written(tmp_path, cr_data,
                                                                                             monkeypatch):
    for key in [k for k in os.environ if k.startswith(SLURM_VARS)]:
        monkeypatch.delenv(key)
    task = {"SLURM_STEP_ID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "56",
            "MASTER_ADDR": "127.0.0.1", "MASKATTN_RENDEZVOUS_TIMEOUT": "2"}
    for key, value in task.items():
        monkeypatch.setenv(key, value)
    with socket.socket() as held:  # another program listens on the port
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(port))
        monkeypatch.setenv("SLURM_PROCID", "0")
        result = train_cli(tmp_path / "taken", cr_data, SMALL)
    assert result.exit_code == 2 and result.output == (
        f"error: MASTER_PORT {port} (set in the environment) is in use on 127.0.0.1, where the first task must listen "
        "for the others: another process holds it; set MASTER_PORT to a free port for every task (export it before "
        "srun)\n")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))  # nobody listens: rank 0 never came
    monkeypatch.setenv("SLURM_PROCID", "1")
    result = train_cli(tmp_path / "unreachable", cr_data, SMALL)
    assert result.exit_code == 2 and result.output.count("\n") == 1 and result.output.startswith(
        f"error: rank 1 could not reach 127.0.0.1:{os.environ['MASTER_PORT']} (MASTER_ADDR:MASTER_PORT; port set in "
        "the environment) within the rendezvous timeout of 2 s (MASKATTN_RENDEZVOUS_TIMEOUT)"), result.output
    monkeypatch.setenv("MASKATTN_RENDEZVOUS_TIMEOUT", "soon")
    result = train_cli(tmp_path / "timeout", cr_data, SMALL)
    assert result.output.startswith("error: MASKATTN_RENDEZVOUS_TIMEOUT='soon': expected a whole number of seconds")
    assert not any((tmp_path / name).exists() for name in ("taken", "unreachable", "timeout"))


def test_the_slurm_nodes_options_are_refused_in_one_line_before_anything_is_written(tmp_path, cr_data):
    common = ["grid", "run", "--out", str(tmp_path / "grid"), "--preset", "cr", "--data", str(cr_data),
              *sets(SMALL), "--launcher", "slurm"]
    for extra, message in (
            (["--slurm-nodes", "0"], "--slurm-nodes must be an int >= 1, got 0"),
            (["--slurm-tasks-per-node", "0"], "--slurm-tasks-per-node must be an int >= 1, got 0"),
            (["--slurm-nodes", "2", "--slurm-gpus-per-task", "2"],
             "--slurm-gpus-per-task 2 with 2 tasks per job (--slurm-nodes 2 × --slurm-tasks-per-node 1): a job of "
             "several tasks runs one process per GPU; ask for --slurm-gpus-per-node G instead"),
            (["--slurm-gpus-per-node", "2", "--slurm-tasks-per-node", "3"],
             "--slurm-tasks-per-node 3: at most --slurm-gpus-per-node 2 (one process per GPU)"),
            (["--slurm-gpus-per-node", "2", "--slurm-gpus-per-task", "1"],
             "--slurm-gpus-per-node 2 and --slurm-gpus-per-task 1: give one of them")):
        result = CliRunner().invoke(app, [*common, *extra], catch_exceptions=False)
        assert result.exit_code == 2 and result.output.startswith(f"error: {message}"), result.output
        assert result.output.count("\n") == 1
    result = CliRunner().invoke(app, [*common[:-2], "--slurm-nodes", "2"], catch_exceptions=False)
    assert result.exit_code == 2 and result.output == "error: --slurm-nodes: only with --launcher slurm\n"
    assert not (tmp_path / "grid").exists()


def test_sbatchs_refusal_of_a_node_count_names_the_option():
    from maskattn.grid.launchers.slurm import SlurmOptions, _refusal

    options = SlurmOptions(nodes=3, partition="debug")
    assert _refusal("sbatch: error: Batch job submission failed: Node count specification invalid", options) == \
        ("--launcher slurm: sbatch refused the jobs: Batch job submission failed: Node count specification invalid "
         "(--slurm-nodes 3)")
    assert _refusal("allocation failure: Requested node configuration is not available", options).endswith(
        "(no node has what --slurm-nodes 3 asks for)")


# --- the two-node cluster ------------------------------------------------------------------------------------------

def _node_count() -> int:
    answer = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=30)
    return len(set(answer.stdout.split()))


@pytest.fixture(scope="module")
def two_nodes():
    """A Slurm controller of two nodes or more that answers: the one running, or scripts/slurm-two-node.sh's,
    started for this module and stopped at its end. A cluster of one node (tests/test_slurm.py's, if it was left
    running) is not stopped here: the tests fail (``MASKATTN_REQUIRE_SLURM=1``) or skip, saying so."""
    required = os.environ.get("MASKATTN_REQUIRE_SLURM") == "1"
    give_up = pytest.fail if required else pytest.skip
    if _answers():
        nodes = _node_count()
        if nodes < 2:
            give_up(f"a Slurm cluster of {nodes} node is running (scripts/slurm-single-node.sh's?): these tests need "
                    "two nodes, and one machine holds one controller — stop it first")
        yield
        return
    if os.geteuid() != 0:
        give_up("Slurm is not running and starting it needs root (scripts/slurm-two-node.sh)")
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=600)
    started = [line.split()[-1] for line in done.stdout.splitlines() if line.startswith("started ")]
    try:
        if done.returncode != 0 or not _answers() or _node_count() < 2:
            give_up(f"Slurm could not be started: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        yield
    finally:
        if started:
            _drain()
            subprocess.run(["bash", str(SCRIPT), "stop", *reversed(started)], timeout=120)


def srun(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``srun -N2 -n2 --kill-on-bad-exit=1 ARGS``: one task on each node; one that fails ends the other."""
    return subprocess.run(["srun", "-N2", "-n2", "--kill-on-bad-exit=1", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or clean_env(), stdin=subprocess.DEVNULL)


def maskattn_train(out: Path, data: Path, settings: list[str]) -> list[str]:
    return [sys.executable, "-m", "maskattn.cli", "train", "--preset", "cr", "--data", str(data), *sets(settings),
            "--out", str(out), "--no-progress"]


def close(mine: list[dict], theirs: list[dict]) -> None:
    """The metrics rows agree: the same rows, steps and accuracies, losses within :data:`RTOL` (module docstring)."""
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs):
        assert a.keys() == b.keys() and {k: a[k] for k in ("step", "epoch", "split")} == \
            {k: b[k] for k in ("step", "epoch", "split")}, (a, b)
        for key in a:
            if isinstance(a[key], float) and key != "accuracy":
                assert math.isclose(a[key], b[key], rel_tol=RTOL), (key, a, b)
            else:
                assert a[key] == b[key], (key, a, b)


def same_weights(mine: Path, theirs: Path) -> bool:
    a, b = load_file(mine), load_file(theirs)
    return a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


@pytest.mark.slurm
def test_maskattn_train_as_two_tasks_on_two_nodes_trains_the_model_of_one_process(two_nodes, cr_data, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    done = subprocess.run(maskattn_train(one, cr_data, SMALL), capture_output=True, text=True, timeout=600,
                          env=clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    done = srun(*maskattn_train(two, cr_data, SMALL))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stderr.strip() == ""  # no warning, from either task
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())
    close(records(two), records(one))  # the train, dev and test rows


@pytest.mark.slurm
def test_a_grid_with_slurm_nodes_2_equals_the_same_grid_run_locally(two_nodes, cr_data, tmp_path):
    out, local = tmp_path / "nodes2", tmp_path / "local"
    common = ["--preset", "cr", "--data", cr_data, *sets(SMALL), "--seeds", "0-1"]
    code, output = grid_cli("run", "--out", out, *common, "--launcher", "slurm", "--slurm-nodes", "2", "--wait")
    assert code == 0, output
    assert "(2 node(s) × 1 task(s) each, 1 thread(s) each)" in output and "submitted 2 run(s)" in output
    for name in ("seed0", "seed1"):
        launch = json.loads((out / name / "launch.json").read_text())
        assert launch["nodes"] == 2 and launch["tasks_per_node"] == 1
        job_folder = out / launch["slurm_folder"]  # one task on each node, each with its log
        assert sorted(p.name for p in job_folder.glob("*_log.out")) == \
            [f"{launch['job_id']}_0_log.out", f"{launch['job_id']}_1_log.out"]
        assert status(out)[name] == f"finished (Slurm job {launch['job_id']})"
    code, output = grid_cli("run", "--out", local, *common, "--jobs", "2", "--threads", "1")
    assert code == 0, output
    for name in ("seed0", "seed1"):
        close(records(out / name), records(local / name))
        assert summary(out / name)["test"]["accuracy"] == summary(local / name)["test"]["accuracy"]


@pytest.fixture(scope="module")
def long_reference(two_nodes, cr_data, tmp_path_factory) -> Path:
    """The :data:`LONG` run, seed 0, uninterrupted on two nodes (``maskattn train`` under srun)."""
    out = tmp_path_factory.mktemp("reference") / "seed0"
    done = srun(*maskattn_train(out, cr_data, [*LONG, "train.seed=0"]))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return out


def _job(run: Path) -> str:
    return json.loads((run / "launch.json").read_text())["job_id"]


def _checkpoint_after(run: Path, step: int) -> bool:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open()] if (run / "metrics.jsonl").exists() else []
    return any(r["split"] == "dev" and r["step"] > step for r in rows) and (run / "last.safetensors").exists()


def _two_node_run_at_its_first_checkpoint(out, cr_data):
    """``(run folder, Slurm job id)`` of a one-run grid submitted as one job of two nodes, once the run has kept its
    first checkpoint."""
    code, output = grid_cli("run", "--out", out, "--preset", "cr", "--data", cr_data, *sets(LONG), "--seeds", "0",
                            "--launcher", "slurm", "--slurm-nodes", "2")
    assert code == 0, output
    run = out / "seed0"
    job = _job(run)
    wait_until(lambda: _checkpoint_after(run, 0), 300, "the run's first checkpoint", poll=0.1)
    return run, job


@pytest.mark.slurm
def test_a_two_node_run_preempted_then_cancelled_continues_across_both_nodes_bit_identically(long_reference, cr_data,
                                                                                             tmp_path):
    """USR2 (submitit's preemption signal) stops every task, the first requeues the job (the same id, both nodes
    again after Slurm's cred_expire), which continues from last.safetensors; scancel then stops it, and the next
    grid run continues it in a new two-node job: every row and weight equals the uninterrupted run's."""
    out = tmp_path / "preempted"
    run, job = _two_node_run_at_its_first_checkpoint(out, cr_data)
    assert status(out)["seed0"] == f"running (Slurm job {job} on n[1-2])"
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    wait_until(lambda: status(out)["seed0"] == f"queued (Slurm job {job}, 2 nodes)", 60, "the requeued job", poll=0.5)
    first = max(r["step"] for r in records(run) if r["split"] == "dev")
    wait_until(lambda: _checkpoint_after(run, first), 300, "a checkpoint of the requeued job", poll=0.1)
    assert not (run / "summary.json").exists(), "the run finished before it was cancelled: make it longer"
    subprocess.run(["scancel", job], check=True)
    wait_until(lambda: not jobs_of(out), 120, "the cancelled job to leave the queue")
    assert status(out) == {"seed0": f"stopped (Slurm job {job})"}
    log = (run / "train.log").read_text()
    assert log.count("interrupted at step") == 2 and "Traceback" not in log  # each stop, once, by the first task

    code, output = grid_cli("run", "--out", out, "--launcher", "slurm", "--slurm-nodes", "2", "--wait")
    assert code == 0 and "seed0: finished" in output, output
    assert _job(run) != job and json.loads((run / "launch.json").read_text())["nodes"] == 2
    assert records(run) == records(long_reference)
    for name in ("last.safetensors", "best.safetensors"):
        assert same_weights(run / name, long_reference / name), name
    requeued = "".join(p.read_text() for p in (out / "slurm" / job).glob(f"{job}_0_log.*"))
    assert f"Requeued job {job}" in requeued


def _task_on(out: Path, node: str) -> int:
    """The pid of the job task (submitit's process) of ``out``'s job on ``node``."""
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"submitit.core._submit" in command and str(out.resolve()).encode() in b" ".join(command) \
                and f"SLURMD_NODENAME={node}".encode() in environ:
            return pid
    raise AssertionError(f"no task of {out} on {node}")


@pytest.mark.slurm
def test_a_task_killed_on_one_node_ends_the_job_and_the_next_grid_run_continues_the_run(long_reference, cr_data,
                                                                                        tmp_path):
    """kill -9 of the task on n2: srun ends the other (--kill-on-bad-exit), whose worker stops keeping its
    checkpoints; the next grid run continues the run — here in a job of one node (no --slurm-nodes), which says
    that the checkpoint of two processes is continued by one, with the same global batch."""
    out = tmp_path / "killed"
    run, job = _two_node_run_at_its_first_checkpoint(out, cr_data)
    os.kill(_task_on(out, "n2"), 9)
    wait_until(lambda: not jobs_of(out), 120, "the job to end after its task on n2 was killed")
    assert not (run / "summary.json").exists()
    assert status(out)["seed0"].split(" (")[0] in ("stopped", "failed")
    checkpoint = max(r["step"] for r in records(run) if r["split"] == "dev")

    code, output = grid_cli("run", "--out", out, "--launcher", "slurm", "--wait")
    assert code == 0 and "seed0: finished" in output, output
    assert status(out) == {"seed0": f"finished (Slurm job {_job(run)})"} and _job(run) != job
    assert "was written by 2 process(es) and is continued by 1, with the same global batch of 15 examples" in \
        (run / "train.log").read_text()
    mine, theirs = records(run), records(long_reference)
    assert [r["step"] for r in mine] == [r["step"] for r in theirs]
    trained = [r for r in mine if r["split"] != "test" and r["step"] <= checkpoint]  # by the two nodes: exactly
    assert trained == [r for r in theirs if r["split"] != "test" and r["step"] <= checkpoint]  # the reference's


STALL = """import os, signal, sys, time
import torch
from maskattn.train.distributed import all_reduce_sum, collective_timeout_s, init_distributed
ctx = init_distributed(torch.device("cpu"))
print(f"rank {ctx.rank} of {ctx.world_size}: {float(all_reduce_sum(torch.ones(1), ctx))}", flush=True)
if ctx.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)  # stalls: alive, connected, silent
try:
    all_reduce_sum(torch.ones(1), ctx)
except RuntimeError as exc:
    print(f"rank {ctx.rank}: timed out after {collective_timeout_s()} s: {str(exc).splitlines()[0]}", flush=True)
    os._exit(3)
"""


@pytest.mark.slurm
def test_a_stalled_task_ends_the_job_at_the_collective_timeout(two_nodes, tmp_path):
    """A task that stops answering (SIGSTOP: its connections stay open) leaves the other in a collective until the
    timeout (MASKATTN_DIST_TIMEOUT, 5 s here; 600 s by default), which then fails, and srun ends the step."""
    script = tmp_path / "stall.py"
    script.write_text(STALL)
    done = srun(sys.executable, str(script), env=clean_env(MASKATTN_DIST_TIMEOUT="5"), timeout=300)
    assert "rank 0 of 2: 2.0" in done.stdout and "rank 1 of 2: 2.0" in done.stdout
    assert re.search(r"rank 0: timed out after 5 s: .*Timed out waiting 5000ms", done.stdout), done.stdout
    assert done.returncode != 0 and "task 0: Exited with exit code 3" in done.stderr


@pytest.mark.slurm
def test_bad_input_on_the_cluster_is_one_line_before_anything_is_written(two_nodes, cr_data, tmp_path):
    code, output = grid_cli("run", "--out", tmp_path / "three", "--preset", "cr", "--data", cr_data, *sets(SMALL),
                            "--seeds", "0", "--launcher", "slurm", "--slurm-nodes", "3")
    assert code == 2 and output == "error: --slurm-nodes 3: the partition debug has 2 nodes (n1, n2); ask for at most 2\n"
    assert not (tmp_path / "three").exists()

    # the task on n2 sees another world size than the one on n1
    train = " ".join(maskattn_train(tmp_path / "disagree", cr_data, SMALL))
    done = srun("bash", "-c", f'[ "$SLURM_PROCID" = 1 ] && export SLURM_NTASKS=3; exec {train}')
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error:")]
    assert done.returncode != 0 and errors, done.stdout + done.stderr
    assert all(line.startswith("error: the Slurm tasks disagree on the world size: rank ") for line in errors), errors
    assert not (tmp_path / "disagree").exists()

    with socket.socket() as held:  # MASTER_PORT taken on the first node
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        done = srun(*maskattn_train(tmp_path / "taken", cr_data, SMALL), env=clean_env(MASTER_PORT=str(port)))
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error:")]
    assert done.returncode != 0 and errors == [
        f"error: MASTER_PORT {port} (set in the environment) is in use on n1, where the first task must listen for "
        "the others: another process holds it; set MASTER_PORT to a free port for every task (export it before srun)"]
    assert not (tmp_path / "taken").exists()


@pytest.mark.parametrize("environ, rank", [
    ({}, 0),  # one process
    ({"WORLD_SIZE": "4", "RANK": "3"}, 3),  # torchrun
    ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_PROCID": "1"}, 1),  # a task of srun -n 2
    ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, 0),  # a one-task step
    ({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, 0),  # the batch script itself: no step
])
def test_the_process_rank_from_the_environment_prints_the_summary_once(environ, rank):
    """Every process of a data-parallel run returns the summary; `maskattn train` prints it from the first only."""
    from maskattn.train.distributed import process_rank
    assert process_rank(environ) == rank
