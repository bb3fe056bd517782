"""Planning a job, before anything is submitted: rule resources -> validated request -> environment -> the job
script (docs/design.md: its modules)."""
