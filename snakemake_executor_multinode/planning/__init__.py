"""Planning a job: rule resources -> validated request -> environment -> the job script, before anything is submitted.

settings (the plugin's settings, declared once), units and request (resources checked and normalised), environment
(profiles: CUDA, conda/venv, NCCL), jobscript with templates/job.sh (the one script template), plan (all of it for
one job), submit_check (`sbatch --test-only` of every planned shape before the first submission), preview.
"""
