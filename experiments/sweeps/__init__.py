"""The paper-style sweeps (shell scripts) and the resumable workers study (``workers.py``)."""
