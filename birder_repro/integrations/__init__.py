"""Birder's and 1-bit Adam's hooks in the frameworks users train with, one module per framework.

``birder_repro.integrations.lightning`` (PyTorch Lightning), ``birder_repro.integrations.accelerate``
(Hugging Face Accelerate) and ``birder_repro.integrations.hf_trainer`` (the Hugging Face Trainer) each import
their framework at the top; this package imports none of them, so that installing one framework is enough
(``pip install birder-repro[integrations]`` installs them all). Like the library they build on
(``birder_repro.comm``, ``birder_repro.optim``), they import nothing of the runner. See docs/integrations.md.
"""
