"""edgeseq.cli: the `edgeseq` command group (`main.py`), one module per command, and the
options several commands share (`options.py`)."""
