"""edgeseq.cli: the `edgeseq` command group (`main.py`); each command lives with its layer."""
