"""Privacy mechanisms: secure aggregation (secagg/), differential privacy (dp/), enclaves (tee/)."""
