"""Moving batches between instances: ``local`` (in memory); TCP comes with the cluster."""
