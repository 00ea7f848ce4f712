#!/usr/bin/env bash
# A real two-node Slurm cluster on this one machine (Debian's slurm-wlm + munge), started as root in about 10 s: what
# the multi-node tests (tests/test_slurm_multinode.py, `pytest -m slurm`) and `maskattn grid run --launcher slurm
# --slurm-nodes 2` run against when no cluster is at hand. Nodes n1 and n2 are two slurmd daemons (`slurmd -N n1`,
# `-N n2`, ports 17001 / 17002, NodeAddr 127.0.0.1), each with the machine's CPUs and 40 % of its memory, sharing its
# file system: `srun -N2` / `sbatch --nodes=2` start tasks on both (SLURM_NODEID 0 and 1, SLURMD_NODENAME n1 / n2),
# and torch.distributed rendezvouses across them on 127.0.0.1 (the nodes' NodeAddr). Installs the two packages when
# they are missing (apt-get). The project's copy of ../shared/tools/slurm-two-node.sh, in the manner of
# scripts/slurm-single-node.sh:
#
#   sudo bash scripts/slurm-two-node.sh          # start; prints "started <name> <pid>" for each daemon it started
#   sudo bash scripts/slurm-two-node.sh stop PID...   # stop those daemons (only those)
#
# Idempotent: a controller that answers with two nodes or more is left alone and nothing is started ("slurm already
# running"); one with fewer (scripts/slurm-single-node.sh's) is refused — stop it first: both write
# /etc/slurm/slurm.conf, and one machine holds one controller. One partition `debug` (MaxTime unlimited) over both
# nodes; jobs get 1 CPU per task unless they ask for more. Accounting storage is off (submitit tolerates it). KillWait
# is 5 s and a requeued job may start again after 20 s (cred_expire; Slurm's defaults are 30 s and 120 s).
set -eu
if [ "${1:-}" = stop ]; then
    shift
    for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
    for pid in "$@"; do for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done; done
    exit 0
fi
if command -v sinfo >/dev/null 2>&1 && timeout 10 sinfo -h >/dev/null 2>&1; then
    n=$(timeout 10 sinfo -h -N -o %N | sort -u | wc -l)
    [ "$n" -ge 2 ] && { echo "slurm already running with $n nodes"; exit 0; }
    echo "error: a Slurm controller with $n node(s) is already running (scripts/slurm-single-node.sh's?): stop it" \
        "first" >&2
    exit 1
fi
[ "$(id -u)" = 0 ] || { echo "error: starting Slurm needs root (slurmd runs jobs as their users)" >&2; exit 1; }
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null && apt-get install -y -qq slurm-wlm munge >/dev/null; }
fi
CTLD=/usr/sbin/slurmctld; SLURMD=/usr/sbin/slurmd
[ -x /usr/sbin/slurmctld-wlm ] && CTLD=/usr/sbin/slurmctld-wlm   # the regular builds, not an emulator's alternative
[ -x /usr/sbin/slurmd-wlm ] && SLURMD=/usr/sbin/slurmd-wlm
H=$(hostname -s)
mkdir -p /etc/munge /etc/slurm /var/run/munge /var/log/munge /var/lib/munge /var/spool/slurmctld-2n \
    /var/spool/slurmd/n1 /var/spool/slurmd/n2 /var/log/slurm
[ -f /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
chown -R munge:munge /etc/munge /var/run/munge /var/log/munge /var/lib/munge
chmod 400 /etc/munge/munge.key
if ! pgrep -x munged >/dev/null; then
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do [ -S /var/run/munge/munge.socket.2 ] && break; sleep 0.1; done
    echo "started munged $(cat /var/run/munge/munged.pid)"
fi
C=$(nproc); M=$(( $(free -m | awk '/Mem:/{print $2}') * 4 / 10 ))
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=local2n
SlurmctldHost=$H
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=20
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
StateSaveLocation=/var/spool/slurmctld-2n
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/var/run/slurmctld.pid
SlurmdPidFile=/var/run/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=5
JobAcctGatherType=jobacct_gather/none
NodeName=n1 NodeHostname=$H NodeAddr=127.0.0.1 Port=17001 CPUs=$C RealMemory=$M State=UNKNOWN
NodeName=n2 NodeHostname=$H NodeAddr=127.0.0.1 Port=17002 CPUs=$C RealMemory=$M State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
CONF
$CTLD
$SLURMD -N n1
$SLURMD -N n2
for _ in $(seq 60); do [ "$(timeout 5 sinfo -h -t idle -N -o %N 2>/dev/null | sort -u | wc -l)" = 2 ] && break; sleep 0.5; done
echo "started slurmctld $(cat /var/run/slurmctld.pid)"
echo "started slurmd-n1 $(cat /var/run/slurmd-n1.pid)"
echo "started slurmd-n2 $(cat /var/run/slurmd-n2.pid)"
sinfo -h >/dev/null
