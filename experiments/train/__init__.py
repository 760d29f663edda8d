"""What ``train.py`` runs, one module per concern.

- :mod:`.run`: ``run(cfg)``, one Hydra job from config check to summary;
  ``validate``, ``config_hash``, ``slurm_env``.
- :mod:`.trainer`: the ``Trainer`` and its loop, over four collaborators:
  :mod:`.step` (one training step), :mod:`.checkpointer` (when and what to
  save, resuming), :mod:`.metrics` (metrics lines and their windows) and
  :mod:`.evaluation` (test accuracy or loss, consensus distance); and
  :mod:`.task`, what is learnt (image classification or language modelling:
  the data, the model, the loss, the evaluation metrics).
- :mod:`.optim`: the ``optim`` and ``scheduler`` config groups as factories.
- :mod:`.config`: the structured-config schemas; :mod:`.checkpoint`: the
  on-disk checkpoint format; :mod:`.reshard`: the global average of a
  checkpoint, to resume with another layout; :mod:`.logger`: the metrics
  sinks (JSONL, wandb).
"""
