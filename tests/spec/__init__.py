"""Reference models written from the documentation alone, and differential tests against them.

Each ``models/<family>.py`` is a brute-force model of one operator family,
written from its docs/ page by someone who had not read the implementation:
a plain loop over every record, no incremental state. Each ``test_<family>.py``
drives the same random input through the model and through streamlet and
compares the outputs exactly. ``make test`` runs ``budget.EXAMPLES`` examples
per test (a few hundred per family); ``make spec`` runs thousands
(``STREAMLET_SPEC_EXAMPLES``).
"""
