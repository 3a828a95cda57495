"""Reading dumps: step directories (complete or interrupted), kernel dumps, per-step reports,
``summarize``. Depends on the format package only."""
