"""Birder in the frameworks users train with: one module per framework, each importing its framework on import.

- :mod:`birder_repro.integrations.lightning`: ``BirderStrategy``, a PyTorch Lightning ``DDPStrategy`` that
  attaches Birder's or 1-bit Adam's hook to the model Lightning wraps and keeps every rank's hook state with
  Lightning's checkpoints.
- :mod:`birder_repro.integrations.accelerate`: ``attach_accelerate``, the hook on the model and optimizer
  Hugging Face Accelerate prepared, every rank's hook state in ``save_state`` / ``load_state``.
- :mod:`birder_repro.integrations.hf_trainer`: ``BirderTrainer``, a Hugging Face ``Trainer`` that attaches the
  hook to the DDP model it builds and keeps every rank's hook state in its checkpoints.

This package imports no framework itself (``import birder_repro.integrations`` stays light); the modules use
only the library (:mod:`birder_repro.comm`, :mod:`birder_repro.optim`), never the runner. Guide:
docs/integrations.md.
"""
