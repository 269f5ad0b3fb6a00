"""Where a topology runs: ``local`` (embedded default); cluster and Spark come later."""
