#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine (Debian's slurm-wlm + munge), started as root in about 30 s: what
# the Slurm tests (tests/test_slurm.py, `pytest -m slurm`) and `maskattn grid run --launcher slurm` run against when
# no cluster is at hand. Installs the two packages when they are missing (apt-get).
#
#   sudo bash scripts/slurm-single-node.sh          # start; prints "started <name> <pid>" for each daemon it started
#   sudo bash scripts/slurm-single-node.sh stop PID...   # stop those daemons (only those)
#
# Idempotent: a controller that already answers (`sinfo`) is left alone and nothing is started ("slurm already
# running"). The node is one partition `debug` (MaxTime unlimited) with the machine's CPUs; jobs get 1 CPU unless
# they ask for more. Accounting storage is off (submitit tolerates it; `sacct` does not work). KillWait is 5 s (the
# default 30 s only slows a cancelled or timed-out job's end down) and a requeued job may start again after 20 s
# (cred_expire; Slurm's default is 120 s).
set -eu
if [ "${1:-}" = stop ]; then
    shift
    for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
    for pid in "$@"; do for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done; done
    exit 0
fi
if command -v sinfo >/dev/null 2>&1 && timeout 10 sinfo -h >/dev/null 2>&1; then echo "slurm already running"; exit 0; fi
[ "$(id -u)" = 0 ] || { echo "error: starting Slurm needs root (slurmd runs jobs as their users)" >&2; exit 1; }
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null && apt-get install -y -qq slurm-wlm munge >/dev/null; }
fi
H=$(hostname -s)
mkdir -p /etc/munge /etc/slurm /var/run/munge /var/log/munge /var/lib/munge /var/spool/slurmctld /var/spool/slurmd \
    /var/log/slurm
[ -f /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
chown -R munge:munge /etc/munge /var/run/munge /var/log/munge /var/lib/munge
chmod 400 /etc/munge/munge.key
if ! pgrep -x munged >/dev/null; then
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do [ -S /var/run/munge/munge.socket.2 ] && break; sleep 0.1; done
    echo "started munged $(cat /var/run/munge/munged.pid)"
fi
MEM=$(( $(free -m | awk '/Mem:/{print $2}') * 8 / 10 ))
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=$H
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=20
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/var/run/slurmctld.pid
SlurmdPidFile=/var/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=5
JobAcctGatherType=jobacct_gather/none
NodeName=$H CPUs=$(nproc) RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$H Default=YES MaxTime=INFINITE State=UP
CONF
/usr/sbin/slurmctld
/usr/sbin/slurmd
for _ in $(seq 60); do timeout 5 sinfo -h 2>/dev/null | grep -q idle && break; sleep 0.5; done
echo "started slurmctld $(cat /var/run/slurmctld.pid)"
echo "started slurmd $(cat /var/run/slurmd.pid)"
sinfo -h >/dev/null
