#!/usr/bin/env bash
# Slurm batch script: the PS runs on the job's first node, one worker per task.
# Workers read SLURM_PROCID / SLURM_NTASKS / SLURM_JOB_NODELIST (see netsense/launch/env.py).
#SBATCH --job-name=netsense
#SBATCH --nodes=2
#SBATCH --ntasks=4
#SBATCH --time=00:30:00
set -euo pipefail
CERTS=${CERTS:-$HOME/netsense-certs}      # made once with: netsense certs --out $CERTS --host <first node>
PS_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --nodes=1 --ntasks=1 -w "$PS_HOST" netsense ps --host 0.0.0.0 --port 4433 --certs "$CERTS" &
sleep 5
NETSENSE_PS="$PS_HOST:4433" srun --ntasks="$SLURM_NTASKS" netsense worker --certs "$CERTS" --model digits-cnn
kill %1
