"""What testing rules needs, shipped so users can test their own rules as the pack is tested.

- :mod:`~diagnoser.testing.rules`: ``diagnose rules test``: promtool-style rule tests, evaluated by
  the real engine against a real Prometheus backfilled with the test's series;
- :mod:`~diagnoser.testing.series`: the series notation (``0+10x30``) and its OpenMetrics form;
- :mod:`~diagnoser.testing.prometheus`: a local Prometheus in a temp dir, backfilled or scraping;
- :mod:`~diagnoser.testing.demo`: the canned scenario ``diagnose now --replay`` style demos use.
"""
