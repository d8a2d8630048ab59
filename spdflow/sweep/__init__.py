"""``spdflow sweep``: a matrix of recipes run locally or on Ray, sharing one cache, with one report.

``spec`` reads and expands the sweep file, ``executors`` runs points (``worker`` is the process
of one point), ``run`` orchestrates and resumes, ``report`` writes sweep.json/.md/.html.
"""
