"""The admin's stats: queries over job history, their rollups, their filters, and the
Prometheus metrics.

SQL: ``gpuq.stats`` owns its analytical SQL (``queries``, ``rollups``, the checks in
``filters``), the one exception to "SQL only in ``gpuq.store``": these aggregate
statements belong with the reports they answer. The conditions a job filter sets are
built once, by ``gpuq.store.job_conditions``, for both. ``make lint`` enforces the rule
(ruff's banned-api, TID251, allowed in ``gpuq/store/`` and ``gpuq/stats/`` only).
"""
