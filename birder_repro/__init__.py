"""birder-repro: reproduce the Birder paper's tables and compare 1-bit optimizers on any cluster layout."""

__version__ = "0.1.0"
