"""The Hydra config tree, installed as the package ``birder_repro.conf`` (pyproject.toml's package-dir) so that
a wheel carries it; Hydra reads it as ``pkg://birder_repro.conf``. Holds no code."""
