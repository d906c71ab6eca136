"""The live incident lab run by ``make demo`` (``demo/run.py``)."""
