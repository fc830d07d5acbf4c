"""Adapters of ``bench/scale.py`` by area: each module registers its steps with
``bench.scale.step``, its inputs in ``bench.scale.INPUTS`` and the steps it holds to the
bounds in ``FIXED`` (and ``GUARDED``, run by the scale guard at quick sizes)."""
