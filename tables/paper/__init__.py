"""The paper's numbers (Birder paper, Tables 1-4; README.md here), installed as the package
``birder_repro.paper_tables`` (pyproject.toml's package-dir) so that a wheel carries them. Holds no code."""
